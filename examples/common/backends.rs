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

/// Runs `task` on the default device of `kind`.
pub fn run_on<T: BackendTask>(kind: BackendKind, task: T) -> T::Output {
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
