//! Differential-test harness: run the same generic case on plain Flex and on
//! `SpillBackend<Flex>` and require bit-identical results (or the same panic).
#![allow(dead_code)]

pub mod op_list;
pub mod spill_file;
pub mod tiny_program;

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Condvar, Mutex};
use std::thread::ThreadId;

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn_spill::{SpillBackend, SpillConfig};

/// The oracle.
pub type Plain = Flex;
/// The backend under test.
pub type Spill = SpillBackend<Flex>;

/// Records which backend methods the cases called.
#[derive(Default)]
pub struct Coverage {
    hit: Mutex<BTreeSet<String>>,
}

impl Coverage {
    pub fn hit(&self, name: &str) {
        self.hit.lock().unwrap().insert(name.to_string());
    }

    /// Panics listing every name of `expected` that no case recorded.
    pub fn assert_covers(&self, expected: &[&str]) {
        let hit = self.hit.lock().unwrap();
        let missing: Vec<_> = expected.iter().filter(|n| !hit.contains(**n)).collect();
        assert!(
            missing.is_empty(),
            "{} backend methods never called by a test: {missing:?}",
            missing.len()
        );
    }
}

/// Bit-exact comparison of two reads: dtype, shape and bytes.
pub fn assert_same_data(plain: &TensorData, spill: &TensorData, what: &str) {
    assert_eq!(plain.dtype, spill.dtype, "{what}: dtype differs");
    assert_eq!(plain.shape, spill.shape, "{what}: shape differs");
    assert_eq!(plain.as_bytes(), spill.as_bytes(), "{what}: bytes differ");
}

pub fn assert_same_all(plain: &[TensorData], spill: &[TensorData], what: &str) {
    assert_eq!(
        plain.len(),
        spill.len(),
        "{what}: number of outputs differs"
    );
    for (i, (p, s)) in plain.iter().zip(spill).enumerate() {
        assert_same_data(p, s, &format!("{what} (output {i})"));
    }
}

/// The text of a panic payload.
pub fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic>".to_string()
    }
}

/// Runs `plain` and `spill`; both must return identical data, or both must panic with the same
/// message (an op `B` rejects must fail the same way through burn-spill).
pub fn compare(
    what: &str,
    plain: impl FnOnce() -> Vec<TensorData>,
    spill: impl FnOnce() -> Vec<TensorData>,
) {
    let p = catch_unwind(AssertUnwindSafe(plain));
    let s = catch_unwind(AssertUnwindSafe(spill));
    match (p, s) {
        (Ok(p), Ok(s)) => assert_same_all(&p, &s, what),
        (Err(p), Err(s)) => assert_eq!(
            panic_message(p),
            panic_message(s),
            "{what}: different panics"
        ),
        (Ok(_), Err(s)) => panic!(
            "{what}: spill panicked where plain did not: {}",
            panic_message(s)
        ),
        (Err(p), Ok(_)) => panic!(
            "{what}: plain panicked ({}) but spill did not",
            panic_message(p)
        ),
    }
}

/// Reads of each primitive kind, blocking.
pub fn read_float<B: Backend>(t: B::FloatTensorPrimitive) -> TensorData {
    burn::tensor::read_sync(B::float_into_data(t)).expect("float read")
}
pub fn read_int<B: Backend>(t: B::IntTensorPrimitive) -> TensorData {
    burn::tensor::read_sync(B::int_into_data(t)).expect("int read")
}
pub fn read_bool<B: Backend>(t: B::BoolTensorPrimitive) -> TensorData {
    burn::tensor::read_sync(B::bool_into_data(t)).expect("bool read")
}
pub fn read_q<B: Backend>(t: B::QuantizedTensorPrimitive) -> TensorData {
    burn::tensor::read_sync(B::q_into_data(t)).expect("quantized read")
}

/// Defines a case generic over the backend, runs it on both and records the names it covers.
///
/// ```ignore
/// diff!(cov, [float_add], |B, dev| {
///     let a = B::float_from_data(TensorData::from([1.0f32, 2.0]), dev);
///     let b = B::float_from_data(TensorData::from([3.0f32, 4.0]), dev);
///     vec![read_float::<B>(B::float_add(a, b))]
/// });
/// ```
#[macro_export]
macro_rules! diff {
    ($cov:expr, [$($name:ident),+ $(,)?], |$B:ident, $dev:ident| $body:block) => {{
        #[allow(unused_imports, unused_variables, unused_mut, non_snake_case)]
        fn case<$B: burn::tensor::backend::Backend>($dev: &$B::Device) -> Vec<burn::tensor::TensorData> {
            use burn::tensor::ops::*;
            $body
        }
        let what = stringify!($($name),+);
        $crate::common::compare(
            what,
            || case::<$crate::common::Plain>(&Default::default()),
            || case::<$crate::common::Spill>(&Default::default()),
        );
        $( $cov.hit(stringify!($name)); )+
    }};
}

/// Spill configuration is process-wide per device and Flex has one device: the thread that
/// holds it, and how many of its `ExclusiveDevice`s are alive.
static DEVICE: Mutex<(Option<ThreadId>, usize)> = Mutex::new((None, 0));
static DEVICE_FREED: Condvar = Condvar::new();

/// Holds the Flex device's spill configuration for one test (tests of a binary run in
/// parallel) and leaves the device unconfigured however the test ends. Declare it first in a
/// test, so that it drops after the test's tensors. A thread that holds it may take it again
/// (a test that compares several runs holds it around all of them, so that no other test's
/// run comes between them and changes what the process has learnt).
pub struct ExclusiveDevice(());

impl ExclusiveDevice {
    pub fn take() -> Self {
        let me = std::thread::current().id();
        // The lock only guards the owner and count (never held across a test), so a panicking
        // test does not poison it; its guard resets the device as it unwinds all the same.
        let mut held = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
        while held.0.is_some_and(|owner| owner != me) {
            held = DEVICE_FREED.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        *held = (Some(me), held.1 + 1);
        drop(held);
        // Made before configuring, so that a failed `configure` still gives the device back.
        let taken = Self(());
        Spill::configure(&Default::default(), SpillConfig::default()).unwrap();
        taken
    }
}

impl Drop for ExclusiveDevice {
    fn drop(&mut self) {
        if let Err(e) = Spill::configure(&Default::default(), SpillConfig::default()) {
            eprintln!("could not reset the device after a test: {e}");
        }
        let mut held = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
        held.1 -= 1;
        if held.1 == 0 {
            held.0 = None;
            DEVICE_FREED.notify_all();
        }
    }
}

/// A `rows x cols` f32 input with small, distinct, explicit values (no RNG).
pub fn input<B: Backend>(
    seed: usize,
    rows: usize,
    cols: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| ((seed * 31 + i * 7) % 23) as f32 * 0.125 - 1.25)
        .collect();
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}
