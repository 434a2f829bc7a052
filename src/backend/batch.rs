//! Batched eviction: several small tensors leave the device in one transfer.
//!
//! Their primitives are read in one Burn transaction (`B::tr_execute`, which a GPU backend runs
//! as one synchronisation instead of one per tensor) and copied into one contiguous host buffer
//! that they share (see [`pack`]). Each tensor then takes its slice of the buffer in place of
//! its device payload, exactly as a single eviction would, unless an op consumed it meanwhile.
//! Where the device's memory is host memory (Flex), a member that owns its buffer alone is
//! handed over instead (see [`super::host::hand_over`]): no read, no copy.

use std::sync::Arc;
use std::time::Instant;

use burn_backend::Backend;
use burn_backend::ops::TransactionPrimitive;

use super::host::pack;
use super::tensor::{Handle, Primitive};
use crate::engine::{DeviceEngine, HandOver, Spillable, Tier};

/// A handle of the batch with its cloned payload and where its data lands in the transaction.
struct Member<'a, B: Backend> {
    at: usize,
    handle: &'a Handle<B>,
    primitive: Primitive<B>,
}

/// Evicts `batch` to the host in one transfer; returns where each went, in order (`None`: it
/// stayed). Tensors that are
/// not this adapter's, are busy, are off the device or are quantized go one by one.
pub(crate) fn evict_batch<B: Backend>(
    batch: &[Arc<dyn Spillable>],
    engine: &DeviceEngine,
) -> Vec<Option<Tier>> {
    let mut moved = vec![None; batch.len()];
    let mut members = Vec::new();
    let mut alone = Vec::new();
    let mut handed_over = 0u64;
    for (at, victim) in batch.iter().enumerate() {
        let handle = victim.as_any().downcast_ref::<Handle<B>>();
        if let Some(handle) = handle {
            match handle.hand_over(engine) {
                HandOver::Moved(tier) => {
                    moved[at] = Some(tier);
                    handed_over += 1;
                    continue;
                }
                HandOver::Stayed => continue,
                HandOver::Refused => {}
            }
        }
        match handle.and_then(|h| Some((h, h.batchable_payload()?))) {
            Some((handle, primitive)) => members.push(Member {
                at,
                handle,
                primitive,
            }),
            None => alone.push(at),
        }
    }
    if members.len() < 2 {
        alone.extend(members.iter().map(|m| m.at));
        members.clear();
    }
    for at in alone {
        moved[at] = batch[at].evict(engine);
    }
    if members.is_empty() {
        if handed_over >= 2 {
            engine.batched(handed_over);
        }
        return moved;
    }

    let start = Instant::now();
    // Backends whose memory burn-spill can read (Flex) are copied straight into the batch.
    let direct: Option<Vec<&[u8]>> = members
        .iter()
        .map(|m| m.handle.direct_bytes(&m.primitive))
        .collect();
    if let Some(direct) = direct {
        let parts = direct
            .into_iter()
            .zip(&members)
            .map(|(bytes, m)| (bytes, m.handle.shape().clone(), m.handle.dtype()));
        let hosts = pack(parts);
        return install(members, hosts, engine, start, moved, handed_over);
    }
    let (mut floats, mut ints, mut bools) = (Vec::new(), Vec::new(), Vec::new());
    for m in &members {
        match m.primitive.clone() {
            Primitive::Float(p) => floats.push(p),
            Primitive::Int(p) => ints.push(p),
            Primitive::Bool(p) => bools.push(p),
            Primitive::Quantized(_) => unreachable!("quantized tensors are not batched"),
        }
    }
    let read = burn_std::future::block_on(B::tr_execute(TransactionPrimitive::<B>::new(
        floats,
        Vec::new(),
        ints,
        bools,
    )));
    let data = match read {
        Ok(data) => data,
        Err(error) => {
            tracing::warn!(target: "burn_spill::engine", ?error,
                "a batched read failed; the tensors are evicted one by one");
            for m in &members {
                moved[m.at] = batch[m.at].evict(engine);
            }
            return moved;
        }
    };
    let (mut floats, mut ints, mut bools) = (
        data.read_floats.into_iter(),
        data.read_ints.into_iter(),
        data.read_bools.into_iter(),
    );
    let mut datas = Vec::with_capacity(members.len());
    for m in &members {
        let next = match m.primitive {
            Primitive::Float(_) => floats.next(),
            Primitive::Int(_) => ints.next(),
            Primitive::Bool(_) => bools.next(),
            Primitive::Quantized(_) => None,
        };
        let checked = next
            .ok_or_else(|| "the transaction returned fewer tensors than it read".to_string())
            .and_then(|d| m.handle.check(&d).map(|()| d));
        match checked {
            Ok(data) => datas.push(data),
            Err(why) => {
                tracing::warn!(target: "burn_spill::engine", error = %why,
                    "a batched read came back wrong; the batch is evicted one by one");
                for m in &members {
                    moved[m.at] = batch[m.at].evict(engine);
                }
                return moved;
            }
        }
    }
    let hosts = pack(
        datas
            .iter()
            .map(|d| (d.as_bytes(), d.shape.clone(), d.dtype)),
    );
    install(members, hosts, engine, start, moved, handed_over)
}

/// Gives each member its slice of the batch buffer. The batch counts the `handed_over`
/// tensors that left in the same pass too.
fn install<B: Backend>(
    members: Vec<Member<'_, B>>,
    hosts: Vec<super::host::HostTensor>,
    engine: &DeviceEngine,
    start: Instant,
    mut moved: Vec<Option<Tier>>,
    handed_over: u64,
) -> Vec<Option<Tier>> {
    engine.batched(members.len() as u64 + handed_over);
    // One transfer moved them all: each is booked its share of its time, by bytes, so that the
    // measured bandwidth (and the cost of a move the engine learns from it) stays true.
    let took = start.elapsed();
    let total = members.iter().map(|m| m.handle.bytes).sum::<u64>().max(1);
    // The batch shares one buffer, which lives while any of its slices stays on the host: so
    // either it all fits under the host limit or it all goes on to disk (and the buffer is
    // freed), never a buffer held whole for the few slices the host had room for.
    let fits = engine.host_room() >= total;
    for (m, host) in members.into_iter().zip(hosts) {
        let share = took.mul_f64(m.handle.bytes as f64 / total as f64);
        moved[m.at] = m.handle.install_evicted(engine, host, share, fits);
    }
    moved
}
