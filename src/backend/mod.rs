//! The Burn 0.21 adapter: the only place that names Burn's backend and ops traits.

pub(crate) mod device;
pub(crate) mod forward;
mod ops;
pub(crate) mod tensor;

use std::fmt;
use std::marker::PhantomData;

use burn_backend::{Backend, BackendTypes, DType, DTypeUsageSet, ExecutionError, TensorData};

use crate::engine::{LiveSummary, ledger_for};
use device::{PersistentScope, device_key};
use tensor::SpillTensor;

/// A Burn backend that wraps backend `B` and gives every tensor a [`SpillTensor`] handle.
///
/// Swap it in under `Autodiff` and nothing else in the training code changes:
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::tensor::Tensor;
/// use burn_spill::SpillBackend;
///
/// type B = Autodiff<SpillBackend<Flex>>; // was Autodiff<Flex>
/// let device = Default::default();
/// let x = Tensor::<B, 2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &device).require_grad();
/// let grads = (x.clone() * x.clone()).sum().backward();
/// assert_eq!(x.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
/// ```
///
/// Every op of every ops trait is forwarded to `B`'s own method, so `B`'s kernels run and
/// results are bit-identical to running on `B` directly.
pub struct SpillBackend<B: Backend> {
    _inner: PhantomData<fn() -> B>,
}

impl<B: Backend> SpillBackend<B> {
    /// What is alive on `device` right now: distinct tensors, their bytes and the peak.
    pub fn live(device: &B::Device) -> LiveSummary {
        ledger_for(device_key::<B>(device)).summary()
    }
}

impl<B: Backend> Clone for SpillBackend<B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for SpillBackend<B> {}

impl<B: Backend> Default for SpillBackend<B> {
    fn default() -> Self {
        Self {
            _inner: PhantomData,
        }
    }
}

impl<B: Backend> fmt::Debug for SpillBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpillBackend<{}>", std::any::type_name::<B>())
    }
}

impl<B: Backend> BackendTypes for SpillBackend<B> {
    type Device = B::Device;

    type FloatTensorPrimitive = SpillTensor<B>;
    type FloatElem = B::FloatElem;

    type IntTensorPrimitive = SpillTensor<B>;
    type IntElem = B::IntElem;

    type BoolTensorPrimitive = SpillTensor<B>;
    type BoolElem = B::BoolElem;

    type QuantizedTensorPrimitive = SpillTensor<B>;
}

impl<B: Backend> Backend for SpillBackend<B> {
    fn ad_enabled(device: &Self::Device) -> bool {
        B::ad_enabled(device)
    }

    fn memory_persistent_allocations<
        Output: Send,
        Input: Send,
        Func: Fn(Input) -> Output + Send,
    >(
        device: &Self::Device,
        input: Input,
        func: Func,
    ) -> Output {
        // The scope is entered inside the closure because that is the thread the tensors are
        // created on, whichever thread `B` chooses to run it.
        B::memory_persistent_allocations(device, input, move |input| {
            let _scope = PersistentScope::enter();
            func(input)
        })
    }

    fn memory_cleanup(device: &Self::Device) {
        B::memory_cleanup(device)
    }

    fn name(device: &Self::Device) -> String {
        format!("spill<{}>", B::name(device))
    }

    fn seed(device: &Self::Device, seed: u64) {
        B::seed(device, seed)
    }

    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        B::sync(device)
    }

    fn staging<'a, Iter>(data: Iter, device: &Self::Device)
    where
        Iter: Iterator<Item = &'a mut TensorData>,
    {
        B::staging(data, device)
    }

    fn supports_dtype(device: &Self::Device, dtype: DType) -> bool {
        B::supports_dtype(device, dtype)
    }

    fn dtype_usage(device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        B::device_count(type_id)
    }
}
