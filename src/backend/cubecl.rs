//! What burn-spill reads of CubeCL backends (wgpu, CUDA; fused or not) that Burn's `Backend`
//! cannot say: the allocator's bytes per stream and its cleanup, the device's memory size, and
//! a tensor's strides.

use std::any::Any;
use std::sync::OnceLock;

use cubecl::Runtime;
use cubecl::client::ComputeClient;

use super::queues::PoolProbe;

/// The runtime's client of one device, made on first use (making it initialises the device,
/// which only an op should do).
struct CubePool<R: Runtime> {
    device: R::Device,
    client: OnceLock<ComputeClient<R>>,
    /// How the device's memory size is read from the client, where this runtime reports it.
    total: fn(&ComputeClient<R>) -> Option<u64>,
}

impl<R: Runtime> CubePool<R> {
    fn client(&self) -> &ComputeClient<R> {
        self.client.get_or_init(|| R::client(&self.device))
    }
}

impl<R: Runtime> PoolProbe for CubePool<R>
where
    R::Device: Send + Sync,
{
    fn usage(&self) -> Option<(u64, u64)> {
        // CubeCL reads the calling thread's stream (the caller picks it).
        let usage = self.client().memory_usage().ok()?;
        Some((usage.bytes_in_use, usage.bytes_reserved))
    }

    fn cleanup(&self) {
        self.client().memory_cleanup();
    }

    fn total_memory(&self) -> Option<u64> {
        (self.total)(self.client())
    }
}

/// The probe for `device` if it is a CubeCL device compiled into this build.
pub(super) fn probe(device: &dyn Any) -> Option<Box<dyn PoolProbe>> {
    #[cfg(feature = "wgpu")]
    if let Some(device) = device.downcast_ref::<cubecl::wgpu::WgpuDevice>() {
        return Some(Box::new(CubePool::<cubecl::wgpu::WgpuRuntime> {
            device: device.clone(),
            client: OnceLock::new(),
            // wgpu does not report its adapter's memory size.
            total: |_| None,
        }));
    }
    #[cfg(feature = "cuda")]
    if let Some(device) = device.downcast_ref::<cubecl::cuda::CudaDevice>() {
        return Some(Box::new(CubePool::<cubecl::cuda::CudaRuntime> {
            device: device.clone(),
            client: OnceLock::new(),
            // cubecl-cuda 0.10 sets the largest page to a quarter of `cuDeviceTotalMem`
            // (`runtime.rs`), the only place it keeps the device's memory size.
            total: |client| Some(client.properties().memory.max_page_size.saturating_mul(4)),
        }));
    }
    let _ = device;
    None
}

/// Has burn-fusion run the ops queued on the calling thread's stream, if `primitive` is a fused
/// CubeCL tensor: their kernels are launched (not waited for), so the next op registered there
/// starts a kernel of its own. Returns whether it was one.
pub(super) fn run_queued_fused_ops(primitive: &dyn Any) -> bool {
    #[cfg(all(feature = "fusion", feature = "wgpu"))]
    if let Some(t) =
        primitive.downcast_ref::<burn_fusion::FusionTensor<
            burn_cubecl::fusion::FusionCubeRuntime<cubecl::wgpu::WgpuRuntime>,
        >>()
    {
        t.client.sync(|| ());
        return true;
    }
    #[cfg(all(feature = "fusion", feature = "cuda"))]
    if let Some(t) =
        primitive.downcast_ref::<burn_fusion::FusionTensor<
            burn_cubecl::fusion::FusionCubeRuntime<cubecl::cuda::CudaRuntime>,
        >>()
    {
        t.client.sync(|| ());
        return true;
    }
    let _ = primitive;
    false
}

/// Whether `primitive` is a CubeCL tensor with contiguous strides; `None` when it is not a
/// CubeCL tensor (a fused one's layout is decided lazily and cannot be read).
pub(super) fn is_contiguous(primitive: &dyn Any) -> Option<bool> {
    #[cfg(feature = "wgpu")]
    if let Some(t) =
        primitive.downcast_ref::<burn_cubecl::tensor::CubeTensor<cubecl::wgpu::WgpuRuntime>>()
    {
        return Some(t.is_contiguous());
    }
    #[cfg(feature = "cuda")]
    if let Some(t) =
        primitive.downcast_ref::<burn_cubecl::tensor::CubeTensor<cubecl::cuda::CudaRuntime>>()
    {
        return Some(t.is_contiguous());
    }
    let _ = primitive;
    None
}
