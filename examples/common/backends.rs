//! The inner backends an example can run on, and the one place that names their types: each
//! exists only when its cargo feature is compiled in.

use std::fmt;

use burn::tensor::backend::Backend;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Flex,
    NdArray,
    Wgpu,
    Cuda,
}

impl BackendKind {
    pub const ALL: [BackendKind; 4] = [Self::Flex, Self::NdArray, Self::Wgpu, Self::Cuda];

    /// Flex, or the first other backend compiled in, so that a build with only `--features
    /// cuda` (say) runs without `--backend`.
    pub const DEFAULT_NAME: &'static str = if cfg!(feature = "flex") {
        "flex"
    } else if cfg!(feature = "ndarray") {
        "ndarray"
    } else if cfg!(feature = "cuda") {
        "cuda"
    } else if cfg!(feature = "wgpu") {
        "wgpu"
    } else {
        "flex"
    };

    pub fn name(self) -> &'static str {
        match self {
            Self::Flex => "flex",
            Self::NdArray => "ndarray",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        }
    }

    /// Whether this build has the backend's cargo feature (same name as the backend).
    pub fn compiled_in(self) -> bool {
        match self {
            Self::Flex => cfg!(feature = "flex"),
            Self::NdArray => cfg!(feature = "ndarray"),
            Self::Wgpu => cfg!(feature = "wgpu"),
            Self::Cuda => cfg!(feature = "cuda"),
        }
    }

    fn list(filter: impl Fn(&BackendKind) -> bool) -> String {
        let names: Vec<_> = Self::ALL
            .iter()
            .filter(|b| filter(b))
            .map(|b| b.name())
            .collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }

    /// Parses `--backend`: the error says what is accepted and, for a known backend that this
    /// build lacks, which feature to rebuild with.
    pub fn parse(value: &str) -> Result<Self, String> {
        let kind = Self::ALL
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(value.trim()))
            .ok_or_else(|| {
                format!(
                    "`{value}` is not a backend; accepted: {} (compiled into this build: {})",
                    Self::list(|_| true),
                    Self::list(|b| b.compiled_in())
                )
            })?;
        if !kind.compiled_in() {
            return Err(format!(
                "`{}` is not compiled into this build; available: {} (rebuild with `--features {}`)",
                kind.name(),
                Self::list(|b| b.compiled_in()),
                kind.name()
            ));
        }
        Ok(kind)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Work that is generic over the inner backend; [`run_on`] picks the type at run time.
pub trait BackendTask {
    type Output;
    fn run<B: Backend>(self, device: B::Device) -> Self::Output;
}

/// How CubeCL's allocator carves device memory into pages (wgpu only: CubeCL 0.10's CUDA runtime
/// takes no memory configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolPages {
    /// CubeCL's default: tensors share large pages (8 MiB and up), and a page goes back to the
    /// driver only when every tensor in it is gone, so reserved bytes stay well above those
    /// in use once tensors come and go.
    Sliced,
    /// One page per allocation, in size buckets: a freed tensor's page can be returned at once,
    /// so reserved bytes follow the bytes in use (at the buckets' rounding).
    Exclusive,
}

impl PoolPages {
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "sliced" => Ok(Self::Sliced),
            "exclusive" => Ok(Self::Exclusive),
            _ => Err(format!(
                "`{value}` is not a page layout; accepted: sliced, exclusive"
            )),
        }
    }
}

/// Runs `task` on the default device of `kind`, its allocator set up with `pages` (wgpu only).
pub fn run_on<T: BackendTask>(kind: BackendKind, pages: Option<PoolPages>, task: T) -> T::Output {
    #[cfg(feature = "wgpu")]
    if kind == BackendKind::Wgpu
        && let Some(pages) = pages
    {
        use burn::backend::wgpu::{MemoryConfiguration, RuntimeOptions, WgpuDevice, graphics};
        let memory_config = match pages {
            PoolPages::Sliced => MemoryConfiguration::SubSlices,
            PoolPages::Exclusive => MemoryConfiguration::ExclusivePages,
        };
        let device = WgpuDevice::default();
        // Before any tensor exists: the setup is fixed at the device's first use.
        burn::backend::wgpu::init_setup::<graphics::AutoGraphicsApi>(
            &device,
            RuntimeOptions {
                memory_config,
                ..Default::default()
            },
        );
        return task.run::<burn::backend::Wgpu>(device);
    }
    if pages.is_some() && kind != BackendKind::Wgpu {
        super::cli::exit_usage(&format!(
            "--pool-pages: applies to --backend wgpu only (CubeCL 0.10's CUDA runtime takes no \
             memory configuration, and `{kind}` has no CubeCL pool)"
        ));
    }
    match kind {
        #[cfg(feature = "flex")]
        BackendKind::Flex => task.run::<burn::backend::Flex>(Default::default()),
        #[cfg(feature = "ndarray")]
        BackendKind::NdArray => task.run::<burn::backend::NdArray>(Default::default()),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => task.run::<burn::backend::Wgpu>(Default::default()),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => task.run::<burn::backend::Cuda>(Default::default()),
        #[allow(unreachable_patterns)]
        other => unreachable!("`--backend {other}` is rejected when the flags are parsed"),
    }
}
