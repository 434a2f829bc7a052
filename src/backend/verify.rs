//! Checking a program against the plain backend, for users' own test suites: the same seeded
//! program runs on `B` and on `SpillBackend<B>` under a [`SpillConfig`], and what it hands back
//! (output tensors, the gradients of parameters it names, losses) must be the same bits.
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use burn::tensor::{Distribution, Tensor, backend::Backend};
//! use burn_spill::SpillConfig;
//! use burn_spill::verify::{Program, Snapshot, verify_against_plain};
//!
//! /// Two steps of a tiny regression, on whichever backend `X` it is given.
//! struct Regression;
//!
//! impl Program for Regression {
//!     fn run<X: Backend>(&mut self, device: &X::Device, out: &mut Snapshot) {
//!         type A<X> = Autodiff<X>;
//!         let w = Tensor::<A<X>, 2>::random([16, 4], Distribution::Default, device).require_grad();
//!         let x = Tensor::<A<X>, 2>::random([8, 16], Distribution::Default, device);
//!         let loss = x.matmul(w.clone()).powi_scalar(2).mean();
//!         let grads = loss.backward();
//!         out.gradient("w", &w, &grads);
//!         out.tensor("loss", loss);
//!     }
//! }
//!
//! let device = Default::default();
//! let config = SpillConfig::default().device_budget_bytes(0);
//! let report = verify_against_plain::<Flex>(&device, config, 7, &mut Regression).unwrap();
//! report.assert_identical();
//! assert_eq!(report.compared, 2);
//! ```

use std::fmt;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{BasicOps, Tensor, TensorData};
use burn_backend::DType;

use crate::{SpillBackend, SpillConfig, SpillError, SpillStats};

/// A program that runs on any backend: the same code on `B` and on `SpillBackend<B>`.
///
/// It gets the device and a [`Snapshot`] to hand back what must match: outputs, losses, and the
/// gradients of the parameters it names. It may build `Autodiff<X>` itself to train. Random
/// ops draw from the backend's seeded generator, which [`verify_against_plain`] seeds the same
/// on both runs.
pub trait Program {
    /// Runs the program on backend `X`, recording what must match into `out`.
    fn run<X: Backend>(&mut self, device: &X::Device, out: &mut Snapshot);
}

/// What one run of a [`Program`] handed back: named tensors as data, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    entries: Vec<(String, Option<TensorData>)>,
}

impl Snapshot {
    /// An empty snapshot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `tensor` (its values, dtype and shape) under `name`.
    pub fn tensor<B: Backend, const D: usize, K: BasicOps<B>>(
        &mut self,
        name: impl Into<String>,
        tensor: Tensor<B, D, K>,
    ) -> &mut Self {
        self.data(name, tensor.into_data())
    }

    /// Records the gradient of `parameter` in `grads` under `name` (a parameter with no
    /// gradient is recorded as such, and must have none on the other backend either).
    pub fn gradient<B: AutodiffBackend, const D: usize>(
        &mut self,
        name: impl Into<String>,
        parameter: &Tensor<B, D>,
        grads: &B::Gradients,
    ) -> &mut Self {
        let gradient = parameter.grad(grads).map(Tensor::into_data);
        self.entries.push((name.into(), gradient));
        self
    }

    /// Records data read some other way (a module's parameters, a list of losses).
    pub fn data(&mut self, name: impl Into<String>, data: TensorData) -> &mut Self {
        self.entries.push((name.into(), Some(data)));
        self
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The first way two snapshots differ.
#[derive(Debug, Clone, PartialEq)]
pub enum Difference {
    /// They hold different numbers of entries.
    Count {
        /// Entries of the plain run.
        plain: usize,
        /// Entries of the spilled run.
        spilled: usize,
    },
    /// The entries at `index` have different names (the program recorded in another order).
    Name {
        /// Position of the entry.
        index: usize,
        /// Its name in the plain run.
        plain: String,
        /// Its name in the spilled run.
        spilled: String,
    },
    /// One run has a gradient for `name` and the other has none.
    Gradient {
        /// The entry.
        name: String,
        /// Whether the plain run had it.
        in_plain: bool,
    },
    /// Different dtypes.
    Dtype {
        /// The entry.
        name: String,
        /// Plain dtype.
        plain: DType,
        /// Spilled dtype.
        spilled: DType,
    },
    /// Different shapes.
    Shape {
        /// The entry.
        name: String,
        /// Plain shape.
        plain: Vec<usize>,
        /// Spilled shape.
        spilled: Vec<usize>,
    },
    /// Different bits.
    Value {
        /// The entry.
        name: String,
        /// The first differing element, as an index into the shape.
        element: Vec<usize>,
        /// How many elements differ.
        differing: usize,
        /// Of how many.
        elements: usize,
        /// The plain value, with its bits.
        plain: String,
        /// The spilled value, with its bits.
        spilled: String,
    },
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::Count { plain, spilled } => write!(
                f,
                "the plain run recorded {plain} entries, the spilled run {spilled}"
            ),
            Difference::Name {
                index,
                plain,
                spilled,
            } => write!(
                f,
                "entry {index} is `{plain}` in the plain run but `{spilled}` in the spilled run"
            ),
            Difference::Gradient { name, in_plain } => {
                let (has, lacks) = if *in_plain {
                    ("plain", "spilled")
                } else {
                    ("spilled", "plain")
                };
                write!(
                    f,
                    "`{name}` has a gradient in the {has} run and none in the {lacks} run"
                )
            }
            Difference::Dtype {
                name,
                plain,
                spilled,
            } => write!(f, "`{name}` is {plain:?} plain but {spilled:?} spilled"),
            Difference::Shape {
                name,
                plain,
                spilled,
            } => write!(
                f,
                "`{name}` has shape {plain:?} plain but {spilled:?} spilled"
            ),
            Difference::Value {
                name,
                element,
                differing,
                elements,
                plain,
                spilled,
            } => write!(
                f,
                "`{name}` differs at element {element:?}: {plain} plain, {spilled} spilled \
                 ({differing} of {elements} elements differ)"
            ),
        }
    }
}

/// What [`verify_against_plain`] (or [`compare`]) found.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyReport {
    /// Entries compared (all of them when they match).
    pub compared: usize,
    /// The first difference, in recording order; `None` when every entry is the same bits.
    pub first_difference: Option<Difference>,
    /// The spilled run's stats, when [`verify_against_plain`] ran it: its own counters (what
    /// moved, over-budget ops, estimate misses; see [`SpillStats::since`]) and its peaks.
    pub stats: Option<SpillStats>,
}

impl VerifyReport {
    /// Whether every entry matched bit for bit.
    pub fn is_identical(&self) -> bool {
        self.first_difference.is_none()
    }

    /// Panics with the first difference, if any.
    #[track_caller]
    pub fn assert_identical(&self) {
        if let Some(difference) = &self.first_difference {
            panic!("burn-spill verify: the spilled run differs from the plain one: {difference}");
        }
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.first_difference {
            None => write!(f, "identical: {} entries, bit for bit", self.compared),
            Some(difference) => write!(f, "different: {difference}"),
        }
    }
}

/// Runs `program` on `B` and then on `SpillBackend<B>` configured with `config` (environment
/// overrides apply on top, as for [`SpillBackend::configure`]), each after seeding the
/// backend with `seed`, and compares what the two runs recorded. The device is left
/// unconfigured (`SpillConfig::default()`, no environment) afterwards.
///
/// # Errors
/// When `config` is refused by [`SpillBackend::configure`].
pub fn verify_against_plain<B: Backend>(
    device: &B::Device,
    config: SpillConfig,
    seed: u64,
    program: &mut impl Program,
) -> Result<VerifyReport, SpillError> {
    B::seed(device, seed);
    let mut plain = Snapshot::new();
    program.run::<B>(device, &mut plain);
    SpillBackend::<B>::configure(device, config)?;
    SpillBackend::<B>::seed(device, seed);
    let before = SpillBackend::<B>::stats(device);
    let mut spilled = Snapshot::new();
    program.run::<SpillBackend<B>>(device, &mut spilled);
    let stats = SpillBackend::<B>::stats(device).since(&before);
    SpillBackend::<B>::configure_without_env(device, SpillConfig::default())?;
    Ok(VerifyReport {
        stats: Some(stats),
        ..compare(&plain, &spilled)
    })
}

/// Compares two snapshots entry by entry, in order: names, presence of gradients, dtypes,
/// shapes and bits.
pub fn compare(plain: &Snapshot, spilled: &Snapshot) -> VerifyReport {
    let mut compared = 0;
    let first_difference = (|| {
        for (index, ((name, p), (other, s))) in
            plain.entries.iter().zip(&spilled.entries).enumerate()
        {
            if name != other {
                return Some(Difference::Name {
                    index,
                    plain: name.clone(),
                    spilled: other.clone(),
                });
            }
            compared += 1;
            let (p, s) = match (p, s) {
                (None, None) => continue,
                (Some(p), Some(s)) => (p, s),
                (p, _) => {
                    return Some(Difference::Gradient {
                        name: name.clone(),
                        in_plain: p.is_some(),
                    });
                }
            };
            if let Some(difference) = compare_data(name, p, s) {
                return Some(difference);
            }
        }
        (plain.len() != spilled.len()).then(|| Difference::Count {
            plain: plain.len(),
            spilled: spilled.len(),
        })
    })();
    VerifyReport {
        compared,
        first_difference,
        stats: None,
    }
}

fn compare_data(name: &str, plain: &TensorData, spilled: &TensorData) -> Option<Difference> {
    if plain.dtype != spilled.dtype {
        return Some(Difference::Dtype {
            name: name.into(),
            plain: plain.dtype,
            spilled: spilled.dtype,
        });
    }
    if plain.shape != spilled.shape {
        return Some(Difference::Shape {
            name: name.into(),
            plain: plain.shape.to_vec(),
            spilled: spilled.shape.to_vec(),
        });
    }
    let (p, s) = (plain.as_bytes(), spilled.as_bytes());
    if p == s {
        return None;
    }
    // Sub-byte quantized values have no whole-byte element: compare those byte by byte.
    let width = match plain.dtype.size() {
        0 => 1,
        size => size,
    };
    let differs = |(a, b): &(&[u8], &[u8])| a != b;
    let pairs = || p.chunks(width).zip(s.chunks(width));
    let first = pairs().position(|pair| differs(&pair)).unwrap_or(0);
    Some(Difference::Value {
        name: name.into(),
        element: unravel(first, &plain.shape),
        differing: pairs().filter(differs).count() + p.len().abs_diff(s.len()) / width,
        elements: p.len() / width,
        plain: element_value(plain.dtype, p.chunks(width).nth(first)),
        spilled: element_value(plain.dtype, s.chunks(width).nth(first)),
    })
}

/// The multi-dimensional index of flat element `flat` of `shape` (row-major).
fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (i, &dim) in shape.iter().enumerate().rev() {
        if dim > 0 {
            index[i] = flat % dim;
            flat /= dim;
        }
    }
    index
}

/// One element's value and its bits, for the report.
fn element_value(dtype: DType, bytes: Option<&[u8]>) -> String {
    let Some(bytes) = bytes else {
        return "nothing".into();
    };
    let hex: String = bytes.iter().rev().map(|b| format!("{b:02x}")).collect();
    let value = match (dtype, bytes.len()) {
        (DType::F64, 8) => f64::from_le_bytes(bytes.try_into().unwrap()).to_string(),
        (DType::F32 | DType::Flex32, 4) => {
            f32::from_le_bytes(bytes.try_into().unwrap()).to_string()
        }
        (DType::F16, 2) => burn_std::f16::from_le_bytes(bytes.try_into().unwrap()).to_string(),
        (DType::BF16, 2) => burn_std::bf16::from_le_bytes(bytes.try_into().unwrap()).to_string(),
        (DType::I64, 8) => i64::from_le_bytes(bytes.try_into().unwrap()).to_string(),
        (DType::I32, 4) => i32::from_le_bytes(bytes.try_into().unwrap()).to_string(),
        (DType::I16, 2) => i16::from_le_bytes(bytes.try_into().unwrap()).to_string(),
        (DType::I8, 1) => (bytes[0] as i8).to_string(),
        (DType::U64, 8) => u64::from_le_bytes(bytes.try_into().unwrap()).to_string(),
        (DType::U32, 4) => u32::from_le_bytes(bytes.try_into().unwrap()).to_string(),
        (DType::U16, 2) => u16::from_le_bytes(bytes.try_into().unwrap()).to_string(),
        (DType::U8, 1) => bytes[0].to_string(),
        _ => return format!("0x{hex}"),
    };
    format!("{value} (0x{hex})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(entries: &[(&str, Option<TensorData>)]) -> Snapshot {
        Snapshot {
            entries: entries
                .iter()
                .map(|(n, d)| (n.to_string(), d.clone()))
                .collect(),
        }
    }

    #[test]
    fn the_first_difference_is_named_with_its_element_and_bits() {
        let a = TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
        let b = TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0, 5.5, 6.0], [2, 3]);
        let same = compare(
            &snapshot(&[("x", Some(a.clone()))]),
            &snapshot(&[("x", Some(a.clone()))]),
        );
        assert!(same.is_identical());
        assert_eq!(same.compared, 1);
        let report = compare(
            &snapshot(&[("x", Some(a.clone())), ("y", Some(a.clone()))]),
            &snapshot(&[("x", Some(a.clone())), ("y", Some(b))]),
        );
        let text = report.first_difference.as_ref().unwrap().to_string();
        assert_eq!(
            text,
            "`y` differs at element [1, 1]: 5 (0x40a00000) plain, 5.5 (0x40b00000) spilled \
             (1 of 6 elements differ)"
        );
        assert!(!report.is_identical());
    }

    #[test]
    fn dtypes_shapes_names_counts_and_missing_gradients_are_told_apart() {
        let f = TensorData::new(vec![1.0f32, 2.0], [2]);
        let d = TensorData::new(vec![1.0f64, 2.0], [2]);
        let r = TensorData::new(vec![1.0f32, 2.0], [1, 2]);
        let cases = [
            (
                vec![("a", Some(f.clone()))],
                vec![("a", Some(d))],
                "is F32 plain but F64 spilled",
            ),
            (
                vec![("a", Some(f.clone()))],
                vec![("a", Some(r))],
                "shape [2] plain but [1, 2]",
            ),
            (
                vec![("a", Some(f.clone()))],
                vec![("b", Some(f.clone()))],
                "entry 0 is `a`",
            ),
            (
                vec![("a", Some(f.clone()))],
                vec![("a", None)],
                "gradient in the plain run",
            ),
            (
                vec![("a", Some(f.clone()))],
                vec![],
                "recorded 1 entries, the spilled run 0",
            ),
        ];
        for (plain, spilled, needle) in cases {
            let report = compare(&snapshot(&plain), &snapshot(&spilled));
            let text = report.to_string();
            assert!(text.contains(needle), "{text}");
        }
        let none = compare(&snapshot(&[("g", None)]), &snapshot(&[("g", None)]));
        assert!(none.is_identical());
    }
}
