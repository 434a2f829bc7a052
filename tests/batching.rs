//! Batched eviction: small tensors evicted together (one transaction read, one shared host
//! buffer) come back bit for bit, from the host and from disk, and leave nothing behind.

mod common;

use burn::backend::Flex;
use burn::tensor::{Bool, FloatDType, Int, Tensor, TensorData};
use burn_spill::{SpillBackend, SpillConfig};
use common::{ExclusiveDevice, assert_same_data};

type Spill = SpillBackend<Flex>;

/// Sixty small tensors of four kinds, each with what plain Flex holds for it.
fn make(device: &burn::tensor::Device<Spill>) -> Vec<(TensorData, Box<dyn Fn() -> TensorData>)> {
    let flex = Default::default();
    let mut out: Vec<(TensorData, Box<dyn Fn() -> TensorData>)> = Vec::new();
    for i in 0..15usize {
        let f = TensorData::new((0..7).map(|x| (x * 31 + i) as f32 * 0.37).collect(), [7]);
        let h = TensorData::new((0..5).map(|x| (x + i) as f32 / 3.0).collect(), [5]);
        let n = TensorData::new((0..3).map(|x| i32::MAX - (x + i) as i32).collect(), [3]);
        let b = TensorData::new((0..9).map(|x| (x + i) % 3 == 0).collect(), [9]);
        let tf = Tensor::<Spill, 1>::from_data(f.clone(), device);
        let th = Tensor::<Spill, 1>::from_data(h.clone(), device).cast(FloatDType::F16);
        let tn = Tensor::<Spill, 1, Int>::from_data(n.clone(), device);
        let tb = Tensor::<Spill, 1, Bool>::from_data(b.clone(), device);
        let expected_h = Tensor::<Flex, 1>::from_data(h, &flex)
            .cast(FloatDType::F16)
            .into_data();
        out.push((
            Tensor::<Flex, 1>::from_data(f, &flex).into_data(),
            Box::new(move || tf.clone().into_data()),
        ));
        out.push((expected_h, Box::new(move || th.clone().into_data())));
        out.push((
            Tensor::<Flex, 1, Int>::from_data(n, &flex).into_data(),
            Box::new(move || tn.clone().into_data()),
        ));
        out.push((
            Tensor::<Flex, 1, Bool>::from_data(b, &flex).into_data(),
            Box::new(move || tb.clone().into_data()),
        ));
    }
    out
}

fn round_trip(config: SpillConfig, expect_disk: bool) {
    let device = Default::default();
    // Made under a roomy budget, then all evicted at once by the tight one.
    Spill::configure(&device, SpillConfig::default().device_budget_bytes(1 << 30)).unwrap();
    let before = Spill::stats(&device);
    {
        let tensors = make(&device);
        Spill::configure(&device, config).unwrap();
        // One more op: the host tier's overflow goes to disk after an op.
        drop(Tensor::<Spill, 1>::zeros([1], &device));
        let stats = Spill::stats(&device);
        assert!(
            stats.eviction_batches > before.eviction_batches,
            "nothing was evicted in a batch: {stats:?}"
        );
        assert!(stats.batched_evictions - before.batched_evictions >= 2);
        if expect_disk {
            assert!(
                stats.host_to_disk.count > before.host_to_disk.count,
                "{stats:?}"
            );
        }
        // Reading each one twice: the first read restores it, later ones find it spilled again.
        for round in 0..2 {
            for (i, (expected, read)) in tensors.iter().enumerate() {
                assert_same_data(expected, &read(), &format!("tensor {i}, read {round}"));
            }
        }
    }
    let stats = Spill::stats(&device);
    let live = Spill::live(&device);
    assert_eq!((live.tensors, live.bytes), (0, 0), "tensors leaked");
    assert_eq!(
        (
            stats.resident.device,
            stats.resident.host,
            stats.resident.disk
        ),
        (0, 0, 0)
    );
    Spill::configure(&device, SpillConfig::default()).unwrap();
}

#[test]
fn batched_tensors_come_back_exactly_from_the_host() {
    let _device = ExclusiveDevice::take();
    round_trip(
        SpillConfig::default()
            .device_budget_bytes(0)
            .unlimited_host(),
        false,
    );
}

#[test]
fn batched_tensors_come_back_exactly_from_disk() {
    let _device = ExclusiveDevice::take();
    round_trip(
        SpillConfig::default()
            .device_budget_bytes(0)
            .host_limit_bytes(0),
        true,
    );
}

#[test]
fn a_batch_member_consumed_meanwhile_is_left_alone() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    Spill::configure(
        &device,
        SpillConfig::default()
            .device_budget_bytes(0)
            .asynchronous(true),
    )
    .unwrap();
    // In-place chains on unique handles race with the workers' batched evictions of them.
    let mut sum = Tensor::<Spill, 1>::zeros([16], &device);
    let mut expected = Tensor::<Flex, 1>::zeros([16], &Default::default());
    for i in 0..200 {
        let x = TensorData::new((0..16).map(|k| (k * i) as f32 * 0.5).collect(), [16]);
        sum = sum + Tensor::from_data(x.clone(), &device);
        expected = expected + Tensor::from_data(x, &Default::default());
    }
    assert_same_data(&expected.into_data(), &sum.into_data(), "sum");
    let stats = Spill::stats(&device);
    assert_eq!(
        (
            stats.resident.device,
            stats.resident.host,
            stats.resident.disk
        ),
        (0, 0, 0)
    );
    Spill::configure(&device, SpillConfig::default()).unwrap();
}
