//! `OpScope`: what one op call does around `B`'s kernel when a budget is in force.
//!
//! The forwarding macro makes one per call: it notes the input handles, asks the engine to make
//! room (restores come back within the budget, the running op's inputs are never evicted),
//! takes the primitives, wraps the outputs, and on drop hands the outputs to the engine, lets
//! the consumed inputs go and settles the device under its watermark. On an unconfigured device
//! every step is a flag check and nothing is allocated.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use burn_backend::Backend;

use super::device::device_key;
use super::tensor::{Primitive, RetiredHandle, SpillTensor, TensorKind};
use crate::engine::{DeviceEngine, OpInput, OpOutput, OpTicket, engine_for};

pub(crate) struct OpScope<B: Backend> {
    name: &'static str,
    /// Set once an input or output lives on a device with a budget.
    engine: Option<Arc<DeviceEngine>>,
    inputs: Vec<OpInput>,
    /// Non-tensor arguments that decide the output size (shapes, dtypes, data lengths).
    hints: Option<DefaultHasher>,
    ticket: Option<OpTicket>,
    outputs: Vec<OpOutput>,
    retired: Vec<RetiredHandle<B>>,
}

impl<B: Backend> OpScope<B> {
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            engine: None,
            inputs: Vec::new(),
            hints: None,
            ticket: None,
            outputs: Vec::new(),
            retired: Vec::new(),
        }
    }

    /// Notes an input the op will read.
    pub(crate) fn input(&mut self, tensor: &SpillTensor<B>) {
        if !tensor.engine().is_tracking() {
            return;
        }
        if self.engine.is_none() {
            self.engine = Some(tensor.engine().clone());
        }
        let evictable = tensor.evictable();
        if evictable {
            tensor.mark_indexed();
        }
        self.inputs.push(OpInput {
            id: tensor.id(),
            bytes: tensor.bytes(),
            tier: tensor.tier(),
            evictable,
            victim: tensor.victim(),
        });
    }

    /// Notes the device a creating op allocates on.
    pub(crate) fn device(&mut self, device: &B::Device) {
        if self.engine.is_none() {
            let engine = engine_for(device_key::<B>(device));
            if engine.is_tracking() {
                self.engine = Some(engine);
            }
        }
    }

    /// Notes an argument that decides the output size.
    pub(crate) fn hint(&mut self, value: &impl Hash) {
        value.hash(self.hints.get_or_insert_with(DefaultHasher::new));
    }

    /// Makes room for the noted inputs and the estimated output.
    pub(crate) fn begin(&mut self) {
        if let Some(engine) = &self.engine {
            let hint = self.hints.as_ref().map_or(0, Hasher::finish);
            self.ticket = engine.begin_op(self.name, &self.inputs, hint);
        }
    }

    /// The primitive of an input, restored if it was spilled.
    pub(crate) fn take(&mut self, tensor: SpillTensor<B>) -> Primitive<B> {
        let (primitive, retired) = tensor.take_primitive();
        if let Some(retired) = retired
            && self.engine.is_some()
        {
            self.retired.push(retired);
        }
        primitive
    }

    pub(crate) fn take_float(&mut self, tensor: SpillTensor<B>) -> B::FloatTensorPrimitive {
        tensor.expect_kind(TensorKind::Float);
        match self.take(tensor) {
            Primitive::Float(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    pub(crate) fn take_int(&mut self, tensor: SpillTensor<B>) -> B::IntTensorPrimitive {
        tensor.expect_kind(TensorKind::Int);
        match self.take(tensor) {
            Primitive::Int(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    pub(crate) fn take_bool(&mut self, tensor: SpillTensor<B>) -> B::BoolTensorPrimitive {
        tensor.expect_kind(TensorKind::Bool);
        match self.take(tensor) {
            Primitive::Bool(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    pub(crate) fn take_quantized(&mut self, tensor: SpillTensor<B>) -> B::QuantizedTensorPrimitive {
        tensor.expect_kind(TensorKind::Quantized);
        match self.take(tensor) {
            Primitive::Quantized(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    /// Notes an output the op produced.
    pub(crate) fn output(&mut self, tensor: SpillTensor<B>) -> SpillTensor<B> {
        let engine = tensor.engine();
        if !engine.is_tracking() {
            return tensor;
        }
        let evictable = tensor.evictable();
        if evictable {
            tensor.mark_indexed();
        }
        match &self.engine {
            Some(own) if !Arc::ptr_eq(own, engine) => {
                // `*_to_device`: the output lives on another device, with its own engine.
                if evictable {
                    engine.register(tensor.id(), tensor.bytes(), tensor.victim());
                }
                return tensor;
            }
            Some(_) => {}
            None => self.engine = Some(engine.clone()),
        }
        self.outputs.push(OpOutput {
            id: tensor.id(),
            bytes: tensor.bytes(),
            evictable,
            victim: tensor.victim(),
        });
        tensor
    }
}

impl<B: Backend> Drop for OpScope<B> {
    fn drop(&mut self) {
        let Some(engine) = self.engine.take() else {
            return;
        };
        let ticket = self.ticket.take();
        if std::thread::panicking() {
            // The op failed: release the pins, move nothing.
            if let Some(ticket) = ticket {
                engine.end_op_without_outputs(ticket);
            }
            return;
        }
        match ticket {
            Some(ticket) => engine.end_op(ticket, &self.outputs),
            None => {
                for out in self.outputs.drain(..).filter(|o| o.evictable) {
                    engine.register(out.id, out.bytes, out.victim);
                }
            }
        }
        self.retired.clear();
        engine.settle();
    }
}
