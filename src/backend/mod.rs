//! The Burn 0.21 adapter: the only place that names Burn's backend and ops traits.

mod batch;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cubecl;
pub(crate) mod device;
pub(crate) mod forward;
mod host;
mod layout;
pub(crate) mod learner;
pub(crate) mod op_scope;
mod ops;
pub(crate) mod output_size;
pub(crate) mod queues;
pub(crate) mod recipe;
pub(crate) mod tensor;
pub mod verify;

use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;

use burn_backend::{Backend, BackendTypes, DType, DTypeUsageSet, ExecutionError, TensorData};

use crate::config::{DeviceBudget, SpillConfig};
use crate::engine::{DeviceEngine, Limits, LiveSummary};
use crate::plan::cost::KernelModel;
use crate::policy::recompute::RebuildTimes;
use crate::tape::{StepAnalysis, StepTape, TapeCounters, TapeFormat};
use crate::{SpillError, SpillStats};
use device::{PersistentScope, device_memory_bytes, dispatches_asynchronously};
use std::sync::Arc;
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
    fn engine(device: &B::Device) -> Arc<DeviceEngine> {
        queues::engine_with_queues::<B>(device).clone()
    }

    /// Sets the budget and tiers of `device`, after applying the `BURN_SPILL_*` environment
    /// variables on top of `config` and validating it.
    ///
    /// Configure before creating the model: tensors created earlier join the budget the first
    /// time an op reads them. Reconfiguring is allowed at any time (the spill directory only
    /// while nothing is on disk).
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use burn_spill::{SpillBackend, SpillConfig};
    /// let device = Default::default();
    /// SpillBackend::<Flex>::configure(&device, SpillConfig::cnn().device_budget_bytes(64 << 20))?;
    /// assert_eq!(SpillBackend::<Flex>::stats(&device).device_budget_bytes, Some(64 << 20));
    /// SpillBackend::<Flex>::configure(&device, SpillConfig::default())?; // back to unlimited
    /// # Ok::<(), burn_spill::SpillError>(())
    /// ```
    pub fn configure(device: &B::Device, config: SpillConfig) -> Result<(), SpillError> {
        Self::configure_without_env(device, config.with_env_overrides()?)
    }

    /// [`configure`](Self::configure) with `config` exactly as given: the `BURN_SPILL_*`
    /// environment variables are not applied. For a harness that measures a reference run on
    /// the same device (the examples measure the plain peak this way) or that gives the
    /// variables a meaning of its own.
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use burn_spill::{SpillBackend, SpillConfig};
    /// let device = Default::default();
    /// SpillBackend::<Flex>::configure_without_env(&device, SpillConfig::default())?;
    /// assert_eq!(SpillBackend::<Flex>::stats(&device).device_budget_bytes, None);
    /// # Ok::<(), burn_spill::SpillError>(())
    /// ```
    pub fn configure_without_env(
        device: &B::Device,
        config: SpillConfig,
    ) -> Result<(), SpillError> {
        config.validate()?;
        let rebuild_profile =
            config.rebuild_device_profile(dispatches_asynchronously::<B>(device))?;
        let budget = match config.get_device_budget() {
            DeviceBudget::Unlimited => None,
            DeviceBudget::Bytes(bytes) => Some(bytes),
            DeviceBudget::Fraction(fraction) => {
                let memory = config
                    .get_device_memory_bytes()
                    .or_else(|| device_memory_bytes::<B>(device))
                    .or_else(|| Self::engine(device).queues().total_memory())
                    .ok_or_else(|| SpillError::DeviceMemoryUnknown {
                        fraction,
                        backend: B::name(device),
                    })?;
                Some((memory as f64 * fraction) as u64)
            }
        };
        let watermark = |ratio: f64| budget.map_or(u64::MAX, |b| (b as f64 * ratio) as u64);
        let limits = Limits {
            budget,
            host_limit: config.get_host_limit_bytes(),
            high_water: watermark(config.get_spill_threshold()),
            low_water: watermark(config.get_cache_ratio()),
            strict: config.is_strict(),
            policy: config.get_policy(),
            prefetch_window: u32::try_from(config.get_prefetch_window()).unwrap_or(u32::MAX),
            asynchronous: config.is_asynchronous(),
            verify_restores: config.is_verifying_restores(),
            remote_first: config.get_tier_order() == crate::TierOrder::RemoteThenDisk,
            recompute: config.get_recompute(),
            rebuild_room: config.get_rebuild_room(),
            keep_state: config.get_keep_state(),
            early_room: config.get_early_room(),
            rebuild_times: rebuild_profile
                .as_ref()
                .map_or(RebuildTimes::Measured, |profile| {
                    RebuildTimes::Modelled(KernelModel::of(profile))
                }),
            pool_margin: config
                .get_pool_cleanup_margin_bytes()
                .unwrap_or_else(|| crate::policy::pool::default_margin(budget.unwrap_or(0))),
        };
        let engine = Self::engine(device);
        engine.set_rebuild_profile(rebuild_profile);
        engine.apply(
            limits,
            config.get_spill_dir().map(PathBuf::as_path),
            config.get_remote_tier(),
        )?;
        engine
            .recorder()
            .set_resample_every(config.get_tape_resample_steps());
        Ok(())
    }

    /// Resident bytes per tier now and at peak, traffic per direction, over-budget ops.
    pub fn stats(device: &B::Device) -> SpillStats {
        Self::engine(device).stats()
    }

    /// The inner backend's own pool figures on the calling thread's stream, without burn-spill
    /// in the way: what a plain run on `B` holds, to compare with [`SpillStats::pool`]. `None`
    /// where the backend reports no pool (only CubeCL backends do: wgpu, CUDA).
    pub fn inner_pool_usage(device: &B::Device) -> Option<crate::engine::PoolUsage> {
        queues::inner_pool_usage(device)
    }

    /// Lowers the peaks reported by [`stats`](Self::stats) to the current resident bytes, to
    /// measure one phase (say, the steps after a warm-up step).
    pub fn reset_peaks(device: &B::Device) {
        Self::engine(device).reset_peaks()
    }

    /// The spill file of `device`, once the disk tier exists.
    pub fn spill_file(device: &B::Device) -> Option<PathBuf> {
        Self::engine(device).spill_file()
    }

    /// What is alive on `device` once its transfer workers are idle, wherever its bytes are:
    /// distinct tensors, their bytes and the peak.
    pub fn live(device: &B::Device) -> LiveSummary {
        let engine = Self::engine(device);
        // A transfer worker may still hold a dropped tensor for a move it is finishing.
        engine.quiesce();
        engine.ledger().summary()
    }

    /// Marks the start of a training step on `device`: the ops since the previous marker become
    /// one finished step of the tape, and recording starts if it was off. A `step_begin` alone
    /// per step is enough (it closes the previous step); see also [`step`](Self::step).
    pub fn step_begin(device: &B::Device) {
        Self::engine(device).step_begin()
    }

    /// Marks the end of a training step. Without a matching `step_begin` it logs a warning and
    /// changes nothing.
    pub fn step_end(device: &B::Device) {
        Self::engine(device).step_end()
    }

    /// Begins a step that ends when the returned guard drops.
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use burn::tensor::Tensor;
    /// use burn_spill::SpillBackend;
    /// let device = Default::default();
    /// {
    ///     let _step = SpillBackend::<Flex>::step(&device);
    ///     let x = Tensor::<SpillBackend<Flex>, 1>::from_floats([1.0, 2.0], &device);
    ///     let _y = x.exp();
    /// }
    /// let tape = SpillBackend::<Flex>::last_step(&device).unwrap();
    /// assert_eq!(tape.ops.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["float_from_data", "float_exp"]);
    /// ```
    pub fn step(device: &B::Device) -> StepGuard<B> {
        Self::step_begin(device);
        StepGuard {
            device: device.clone(),
        }
    }

    /// Turns tape recording on or off for `device` (markers turn it on). Turning it on opens a
    /// fresh step; until a marker comes, steps are found in the op stream.
    pub fn record_tape(device: &B::Device, on: bool) {
        Self::engine(device).recorder().set_enabled(on)
    }

    /// Steps the tape has closed, divergences it detected, and whether it is verifying now.
    pub fn tape_counters(device: &B::Device) -> TapeCounters {
        Self::engine(device).recorder().counters()
    }

    /// The tape of the last finished step on `device`.
    pub fn last_step(device: &B::Device) -> Option<Arc<StepTape>> {
        Self::engine(device).recorder().last_step()
    }

    /// Of the last few finished steps on `device`, the one with the most ops: the training
    /// step, where the last one a training loop marks may hold only a few reads (a step opened
    /// for a batch that never came).
    pub fn fullest_recent_step(device: &B::Device) -> Option<Arc<StepTape>> {
        Self::engine(device).recorder().fullest_step()
    }

    /// The analysis of the last finished step: DAG, live intervals, next uses, forward/backward
    /// split, saved activations, critical path, peak live bytes.
    pub fn analyze_last_step(device: &B::Device) -> Option<StepAnalysis> {
        Self::last_step(device).map(|tape| StepAnalysis::new(&tape))
    }

    /// Writes the last finished step's tape to `path` in `format`.
    ///
    /// Setting `BURN_SPILL_TRACE=path` does this at process exit for every device that
    /// recorded a step: the JSON to `path`, the DOT to `path.dot` and the Perfetto trace to
    /// `path.perfetto.json` (recording is turned on for every device when the variable is set).
    pub fn export_tape(
        device: &B::Device,
        path: impl AsRef<std::path::Path>,
        format: TapeFormat,
    ) -> Result<(), SpillError> {
        let tape = Self::last_step(device).ok_or(SpillError::NoTape)?;
        crate::tape::write_file(path.as_ref(), &crate::tape::render(&tape, format))
    }

    /// Test hook: the next `n` spill-file writes on `device` fail as a full disk would.
    #[doc(hidden)]
    pub fn fail_next_disk_writes(device: &B::Device, n: u32) {
        Self::engine(device).fail_next_disk_writes(n)
    }
}

/// Ends the step begun by [`SpillBackend::step`] when dropped.
#[must_use = "the step ends when the guard drops"]
pub struct StepGuard<B: Backend> {
    device: B::Device,
}

impl<B: Backend> Drop for StepGuard<B> {
    fn drop(&mut self) {
        SpillBackend::<B>::step_end(&self.device)
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

    /// Returns the inner pool's free pages on every stream burn-spill's threads used on the
    /// device (CubeCL cleans only the calling thread's stream), then `B`'s own cleanup.
    fn memory_cleanup(device: &Self::Device) {
        Self::engine(device).return_pool_pages();
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
