//! Data-parallel training through burn-collective, one step at a time: [`PEERS`] threads on one
//! device, each training a clone of one model on its own part of the step's items and
//! all-reducing (mean) the gradients before its Adam step. The collective's server runs on its
//! own threads, so a spilled run's handles are dropped there too. (Cargo feature `collective`.)

use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use burn::collective::{
    AllReduceStrategy, CollectiveConfig, PeerId, ReduceOperation, finish_collective, register,
};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;

use super::Stepper;
use crate::common::trainers::{Trained, parameter_data};

/// Peers of one data-parallel run.
pub const PEERS: usize = 2;

/// A data-parallel run whose [`Stepper::step`] runs one step on every peer.
pub struct DataParallel {
    /// One sender per peer: a message runs a step, and dropping them ends the peers.
    steps: Vec<Sender<()>>,
    /// Each peer's loss, once per step.
    losses: Receiver<f32>,
    peers: Vec<JoinHandle<()>>,
}

impl DataParallel {
    /// Builds the model once (seeded, as a `Trainer` does) and starts a peer per clone; each
    /// peer trains on `batch` items a step.
    pub fn new<A, M>(config: &M::Config, task: M::Task, batch: usize, device: &A::Device) -> Self
    where
        A: AutodiffBackend,
        M: Trained<A> + Send + 'static,
        M::Task: Send + 'static,
    {
        A::seed(device, M::seed(&task));
        let model = M::build(config, device);
        // Burn initialises a parameter on first use, and a clone of one not yet initialised
        // draws its own: the peers must share one set (and one set of parameter ids, which the
        // all-reduce pairs by).
        drop(parameter_data(&model));
        let collective = CollectiveConfig::default()
            .with_num_devices(PEERS)
            .with_local_all_reduce_strategy(AllReduceStrategy::Tree(2));
        let (loss_sender, losses) = channel();
        let mut steps = Vec::with_capacity(PEERS);
        let mut peers = Vec::with_capacity(PEERS);
        for peer in 0..PEERS {
            let (step_sender, step_receiver) = channel::<()>();
            steps.push(step_sender);
            let (mut model, task, device) = (model.clone(), task.clone(), device.clone());
            let (collective, loss_sender) = (collective.clone(), loss_sender.clone());
            peers.push(std::thread::spawn(move || {
                let id = PeerId::from(peer);
                // Its own autodiff leaves: clones share the parameters' graph nodes, and
                // burn-autodiff 0.21 can deadlock when two threads' graphs merge through them
                // (one thread in backward, the other registering an op).
                model = model.fork(&device);
                // The collective works on the inner backend: gradients live there.
                register::<A::InnerBackend>(id, device.clone(), collective)
                    .expect("the peer registers");
                let mut optim = AdamConfig::new().init();
                let mut step = 0u64;
                while step_receiver.recv().is_ok() {
                    let first = (step * PEERS as u64 + peer as u64) * batch as u64;
                    let indices: Vec<u64> = (first..first + batch as u64).collect();
                    let loss = model.loss_on(&task, &indices, &device);
                    let grads = GradientsParams::from_grads(loss.backward(), &model)
                        .all_reduce::<A::InnerBackend>(id, ReduceOperation::Mean)
                        .expect("the gradients are all-reduced");
                    model = optim.step(M::LEARNING_RATE, model, grads);
                    step += 1;
                    if loss_sender.send(loss.into_scalar().elem()).is_err() {
                        break;
                    }
                }
                finish_collective::<A::InnerBackend>(id).expect("the peer leaves");
            }));
        }
        Self {
            steps,
            losses,
            peers,
        }
    }
}

impl Stepper for DataParallel {
    fn step(&mut self) -> f32 {
        for peer in &self.steps {
            peer.send(()).expect("the peer is running");
        }
        // Every peer's loss is received (they are the same): the last one is the step's.
        let mut loss = 0.0;
        for _ in 0..PEERS {
            loss = self.losses.recv().expect("a peer stopped mid-step");
        }
        loss
    }
}

impl Drop for DataParallel {
    fn drop(&mut self) {
        self.steps.clear();
        for peer in self.peers.drain(..) {
            // A peer that panicked already printed why; the bench goes on without its row.
            let _ = peer.join();
        }
    }
}
