//! Every dtype of Burn 0.21 through the host tier and through the disk tier, bit for bit.
//!
//! Each case is a `[2, 4]` tensor whose bit patterns would expose a cast on the way (NaN
//! payloads, signalling NaNs, -0.0, subnormals, infinities, values that a lower precision would
//! round, integer extremes). Under a device budget of 0 every tensor not used by the running op
//! is spilled after each op; with the host unlimited it stays on the host, with a host limit of
//! 0 it goes on to the spill file. The test checks where the tensor is (`residency()`), reads it
//! back (a restore), compares dtype, shape and bytes with what plain Flex returns for the same
//! tensor (and, where the data was given explicitly, with the input itself), then runs ops on
//! the restored tensor and compares those with plain Flex too.
//!
//! Flex accepts every dtype at creation: it stores `TensorData`'s bytes with their dtype as
//! they are. Some of its kernels do not support every dtype; an op that panics on plain Flex
//! must panic with the same message through burn-spill (`common::compare`).

mod common;

use burn::tensor::backend::Backend;
use burn::tensor::quantization::{
    BlockSize, QTensorPrimitive, QuantLevel, QuantScheme, QuantStore, QuantValue,
};
use burn::tensor::{Bool, BoolStore, DType, Int, Tensor, TensorData, TensorPrimitive, bf16, f16};
use burn_spill::{SpillConfig, Tier};
use common::{ExclusiveDevice, Plain, Spill, assert_same_data, compare};

const SHAPE: [usize; 2] = [2, 4];

// ---------------------------------------------------------------------------------------------
// The cases.
// ---------------------------------------------------------------------------------------------

/// How a case's tensor is made.
#[derive(Clone)]
enum Source {
    /// Uploaded as is (`from_data` with the data's own dtype, so nothing converts it).
    Float(TensorData),
    Int(TensorData),
    Bool(TensorData),
    /// Quantized on the backend from f32 values.
    QuantizeDynamic(QuantScheme),
}

struct Case {
    name: &'static str,
    source: Source,
}

fn bytes_of_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn bytes_of_u32(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn float_case(name: &'static str, data: TensorData) -> Case {
    Case {
        name,
        source: Source::Float(data),
    }
}

fn int_case(name: &'static str, data: TensorData) -> Case {
    Case {
        name,
        source: Source::Int(data),
    }
}

fn cases() -> Vec<Case> {
    let f32_bits: Vec<f32> = [
        0x7fc0_1234u32, // quiet NaN with a payload
        0xff80_0001,    // negative signalling NaN
        0x8000_0000,    // -0.0
        0x0000_0001,    // smallest subnormal
        0x7f7f_ffff,    // MAX
        0x7f80_0000,    // +inf
        0x3dcc_cccd,    // 0.1 (not representable in f16 or bf16)
        0x3f80_0001,    // 1 + 2^-23
    ]
    .into_iter()
    .map(f32::from_bits)
    .collect();
    let f64_bits: Vec<f64> = [
        0x7ff8_0000_dead_beefu64, // quiet NaN with a payload
        0x7ff0_0000_0000_0001,    // signalling NaN
        0x8000_0000_0000_0000,    // -0.0
        0x0000_0000_0000_0001,    // smallest subnormal
        0x7fef_ffff_ffff_ffff,    // MAX
        0xfff0_0000_0000_0000,    // -inf
        0x3fb9_9999_9999_999a,    // 0.1 (not representable in f32)
        0x3ff0_0000_0000_0001,    // 1 + 2^-52
    ]
    .into_iter()
    .map(f64::from_bits)
    .collect();
    let f16_bits: Vec<f16> = [
        0x7e01u16, // quiet NaN with a payload
        0xfc01,    // negative signalling NaN
        0x8000,    // -0.0
        0x0001,    // smallest subnormal
        0x7bff,    // MAX
        0x7c00,    // +inf
        0x2e66,    // ~0.1
        0x3c01,    // 1 + 2^-10 (not representable in bf16)
    ]
    .into_iter()
    .map(f16::from_bits)
    .collect();
    let bf16_bits: Vec<bf16> = [
        0x7fc1u16, // quiet NaN with a payload
        0xff81,    // negative signalling NaN
        0x8000,    // -0.0
        0x0001,    // smallest subnormal
        0x7f7f,    // MAX (beyond f16)
        0xff80,    // -inf
        0x3dcd,    // ~0.1
        0x3f81,    // 1 + 2^-7
    ]
    .into_iter()
    .map(bf16::from_bits)
    .collect();

    let bools = vec![true, false, false, true, true, true, false, true];
    let bool_u8: Vec<u8> = bools.iter().map(|&b| b as u8).collect();
    let bool_u32: Vec<u32> = bools.iter().map(|&b| b as u32).collect();

    let q8 = QuantScheme::default()
        .with_value(QuantValue::Q8S)
        .with_store(QuantStore::Native);
    vec![
        float_case("F64", TensorData::new(f64_bits, SHAPE)),
        float_case("F32", TensorData::new(f32_bits.clone(), SHAPE)),
        float_case("Flex32", TensorData::from_bytes_vec(bytes_of_f32(&f32_bits), SHAPE, DType::Flex32)),
        float_case("F16", TensorData::new(f16_bits, SHAPE)),
        float_case("BF16", TensorData::new(bf16_bits, SHAPE)),
        int_case(
            "I64",
            TensorData::new(
                vec![i64::MIN, i64::MAX, -1, 0, 1, (1 << 53) + 1, -(1 << 53) - 1, 0x0102_0304_0506_0708],
                SHAPE,
            ),
        ),
        int_case(
            "I32",
            TensorData::new(vec![i32::MIN, i32::MAX, -1, 0, 1, (1 << 24) + 1, -(1 << 24) - 1, 0x0102_0304], SHAPE),
        ),
        int_case("I16", TensorData::new(vec![i16::MIN, i16::MAX, -1, 0, 1, 2049, -2049, 0x0102], SHAPE)),
        int_case("I8", TensorData::new(vec![i8::MIN, i8::MAX, -1, 0, 1, 17, -17, 0x5a], SHAPE)),
        int_case(
            "U64",
            TensorData::new(
                vec![0, u64::MAX, 1 << 63, (1 << 53) + 1, 1, u64::MAX - 1, 0x0102_0304_0506_0708, 255],
                SHAPE,
            ),
        ),
        int_case(
            "U32",
            TensorData::new(vec![0, u32::MAX, 1 << 31, (1 << 24) + 1, 1, u32::MAX - 1, 0x0102_0304, 255], SHAPE),
        ),
        int_case("U16", TensorData::new(vec![0, u16::MAX, 1 << 15, 2049, 1, u16::MAX - 1, 0x0102, 255], SHAPE)),
        int_case("U8", TensorData::new(vec![0u8, 255, 128, 1, 254, 127, 0x5a, 0xa5], SHAPE)),
        Case { name: "Bool(Native)", source: Source::Bool(TensorData::new(bools, SHAPE)) },
        Case {
            name: "Bool(U8)",
            source: Source::Bool(TensorData::from_bytes_vec(bool_u8, SHAPE, DType::Bool(BoolStore::U8))),
        },
        Case {
            name: "Bool(U32)",
            source: Source::Bool(TensorData::from_bytes_vec(
                bytes_of_u32(&bool_u32),
                SHAPE,
                DType::Bool(BoolStore::U32),
            )),
        },
        Case {
            name: "QFloat(default scheme, per tensor)",
            source: Source::QuantizeDynamic(<<Plain as burn::tensor::backend::BackendTypes>::QuantizedTensorPrimitive as QTensorPrimitive>::default_scheme()),
        },
        Case { name: "QFloat(Q8S, per tensor)", source: Source::QuantizeDynamic(q8) },
        Case {
            name: "QFloat(Q8S, blocks of 4)",
            source: Source::QuantizeDynamic(q8.with_level(QuantLevel::Block(BlockSize::new([4])))),
        },
        Case {
            name: "QFloat(from quantized data)",
            source: Source::Float(TensorData::quantized(
                vec![-128i8, 127, 0, -1, 1, 64, -64, 100],
                SHAPE,
                q8,
                &[0.0123],
            )),
        },
    ]
}

/// Values to quantize: distinct magnitudes, both signs, one zero.
const TO_QUANTIZE: [f32; 8] = [0.5, -2.25, 1.75, -0.0, 3.0, -0.75, 2.5, 1e-3];

// ---------------------------------------------------------------------------------------------
// A tensor of any kind.
// ---------------------------------------------------------------------------------------------

enum T<B: Backend> {
    /// Float or quantized.
    F(Tensor<B, 2>),
    I(Tensor<B, 2, Int>),
    B(Tensor<B, 2, Bool>),
}

impl<B: Backend> Clone for T<B> {
    fn clone(&self) -> Self {
        match self {
            T::F(t) => T::F(t.clone()),
            T::I(t) => T::I(t.clone()),
            T::B(t) => T::B(t.clone()),
        }
    }
}

impl<B: Backend> T<B> {
    fn make(source: &Source, dev: &B::Device) -> Self {
        match source {
            Source::Float(d) => T::F(Tensor::from_data(d.clone(), (dev, d.dtype))),
            Source::Int(d) => T::I(Tensor::from_data(d.clone(), (dev, d.dtype))),
            Source::Bool(d) => T::B(Tensor::from_data(d.clone(), (dev, d.dtype))),
            Source::QuantizeDynamic(scheme) => T::F(
                Tensor::<B, 2>::from_data(
                    TensorData::new(TO_QUANTIZE.to_vec(), SHAPE),
                    (dev, DType::F32),
                )
                .quantize_dynamic(scheme),
            ),
        }
    }

    fn read(self) -> TensorData {
        match self {
            T::F(t) => t.into_data(),
            T::I(t) => t.into_data(),
            T::B(t) => t.into_data(),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            T::F(t) => t.dtype(),
            T::I(t) => t.dtype(),
            T::B(t) => t.dtype(),
        }
    }

    fn is_quantized(&self) -> bool {
        matches!(self.dtype(), DType::QFloat(_))
    }

    /// Runs op `name` of [`OPS`] on a clone of the tensor and reads the result; `None` when the
    /// op does not apply to this kind of tensor.
    fn apply(&self, name: &str) -> Option<TensorData> {
        let q = self.is_quantized();
        Some(match (name, self.clone()) {
            ("reshape", T::F(t)) => t.reshape([4, 2]).into_data(),
            ("reshape", T::I(t)) => t.reshape([4, 2]).into_data(),
            ("reshape", T::B(t)) => t.reshape([4, 2]).into_data(),
            ("swap_dims", T::F(t)) => t.swap_dims(0, 1).into_data(),
            ("swap_dims", T::I(t)) => t.swap_dims(0, 1).into_data(),
            ("swap_dims", T::B(t)) => t.swap_dims(0, 1).into_data(),
            ("slice", T::F(t)) => t.slice([0..2, 1..3]).into_data(),
            ("slice", T::I(t)) => t.slice([0..2, 1..3]).into_data(),
            ("slice", T::B(t)) => t.slice([0..2, 1..3]).into_data(),
            ("row", T::F(t)) => t.slice([1..2, 0..4]).into_data(),
            ("row", T::I(t)) => t.slice([1..2, 0..4]).into_data(),
            ("row", T::B(t)) => t.slice([1..2, 0..4]).into_data(),
            ("cat", T::F(t)) => Tensor::cat(vec![t.clone(), t], 0).into_data(),
            ("cat", T::I(t)) => Tensor::cat(vec![t.clone(), t], 0).into_data(),
            ("cat", T::B(t)) => Tensor::cat(vec![t.clone(), t], 0).into_data(),
            ("equal", T::F(t)) if !q => t.clone().equal(t).into_data(),
            ("equal", T::I(t)) => t.clone().equal(t).into_data(),
            ("equal", T::B(t)) => t.clone().equal(t).into_data(),
            ("compute", T::F(t)) if q => t.dequantize().into_data(),
            ("compute", T::F(t)) => t.neg().into_data(),
            ("compute", T::I(t)) => t.max_dim(1).into_data(),
            ("compute", T::B(t)) => t.bool_not().into_data(),
            ("argmax", T::F(t)) if !q => t.argmax(1).into_data(),
            ("argmax", T::I(t)) => t.argmax(1).into_data(),
            _ => return None,
        })
    }
}

/// Whether op `name` of [`OPS`] applies to the case's kind of tensor (without running it).
fn applies(source: &Source, name: &str) -> bool {
    let quantized = match source {
        Source::Float(d) => matches!(d.dtype, DType::QFloat(_)),
        Source::QuantizeDynamic(_) => true,
        Source::Int(_) | Source::Bool(_) => false,
    };
    let not_for_quantized = quantized && matches!(name, "equal" | "argmax");
    let not_for_bool = matches!(source, Source::Bool(_)) && name == "argmax";
    !not_for_quantized && !not_for_bool
}

/// The ops run on a restored tensor: layout ops for every kind, then ops that compute (`neg`
/// for floats, `dequantize` for quantized, `max_dim` for ints, `bool_not` for bools). Under a
/// budget of 0 each op's output is spilled too before it is read, so the outputs cross the tier
/// as well: `swap_dims` and `slice` give views that are not contiguous, `row` a contiguous view
/// that starts inside its buffer.
const OPS: [&str; 8] = [
    "reshape",
    "swap_dims",
    "slice",
    "row",
    "cat",
    "equal",
    "compute",
    "argmax",
];

/// The ops plain Flex 0.21 itself rejects for a dtype (it panics in the kernel; burn-spill must
/// panic the same way, which the round trips check). Creating, reading and reshaping work for
/// every dtype, so every dtype still goes through both tiers exactly.
/// - Flex32: stored and read back as given, but no kernel copies it to a contiguous layout
///   (swap_dims, slice and row reads: "Unsupported dtype for contiguous copy: Flex32"), concatenates,
///   compares, negates or takes argmax of it ("cat: unsupported dtype Flex32", ...).
/// - U64, U32, U16, U8: `argmax` ("argmax: unsupported dtype U64").
/// - Bool(U32): stored and read back as given, but "burn-flex: Bool(U32) storage is not yet
///   supported" for a contiguous copy (swap_dims, slice, row), `cat` fails on a dtype mismatch, `equal` and `bool_not`
///   take only Bool(Native) and Bool(U8).
const FLEX_REJECTS: &[(&str, &str)] = &[
    ("Flex32", "swap_dims"),
    ("Flex32", "slice"),
    ("Flex32", "row"),
    ("Flex32", "cat"),
    ("Flex32", "equal"),
    ("Flex32", "compute"),
    ("Flex32", "argmax"),
    ("U64", "argmax"),
    ("U32", "argmax"),
    ("U16", "argmax"),
    ("U8", "argmax"),
    ("Bool(U32)", "swap_dims"),
    ("Bool(U32)", "slice"),
    ("Bool(U32)", "row"),
    ("Bool(U32)", "cat"),
    ("Bool(U32)", "equal"),
    ("Bool(U32)", "compute"),
];

fn residency(t: &T<Spill>) -> Tier {
    match t.clone() {
        T::F(t) => match t.into_primitive() {
            TensorPrimitive::Float(p) => p.residency(),
            TensorPrimitive::QFloat(q) => q.residency(),
        },
        T::I(t) => t.into_primitive().residency(),
        T::B(t) => t.into_primitive().residency(),
    }
}

// ---------------------------------------------------------------------------------------------
// The round trip.
// ---------------------------------------------------------------------------------------------

/// What plain Flex reads back for a case's tensor.
fn oracle(case: &Case) -> TensorData {
    let t = T::<Plain>::make(&case.source, &Default::default());
    let read = t.read();
    if let Source::Float(d) | Source::Int(d) | Source::Bool(d) = &case.source
        && !matches!(d.dtype, DType::QFloat(_))
    {
        // Flex keeps the bytes it was given: the oracle is the input itself.
        assert_same_data(
            d,
            &read,
            &format!("{}: plain Flex changed the data", case.name),
        );
    }
    read
}

/// Makes the case's tensor on `SpillBackend<Flex>` and runs one unrelated op, after which the
/// tensor (not an input of that op) must have been spilled to `tier`.
fn spilled(source: &Source, tier: Tier, what: &str) -> (T<Spill>, Tensor<Spill, 1>) {
    let dev = Default::default();
    let t = T::<Spill>::make(source, &dev);
    let other = Tensor::<Spill, 1>::from_data(TensorData::new(vec![1.0f32, 2.0], [2]), &dev).exp();
    assert_eq!(residency(&t), tier, "{what}: after an unrelated op");
    (t, other)
}

/// Sends `case` through `tier` on `SpillBackend<Flex>` and compares every read with plain Flex.
fn round_trip(case: &Case, tier: Tier) {
    let _device = ExclusiveDevice::take();
    let dev = Default::default();
    let what = format!("{} through {tier:?}", case.name);
    let expected = oracle(case);

    let config = SpillConfig::default().device_budget_bytes(0);
    let config = match tier {
        Tier::Host => config.unlimited_host(),
        Tier::Disk => config.host_limit_bytes(0),
        Tier::Device => unreachable!("the device tier is not a spill tier"),
    };
    Spill::configure(&dev, config).unwrap();
    let before = Spill::stats(&dev);
    {
        let (t, _other) = spilled(&case.source, tier, &what);
        assert_eq!(t.dtype(), expected.dtype, "{what}: dtype of the handle");
        let read = t.clone().read();
        assert_same_data(&expected, &read, &format!("{what}: first read"));
        // The read restored it; the read's own settle spilled it again.
        assert_eq!(residency(&t), tier, "{what}: after the read");
        let again = t.read();
        assert_same_data(&expected, &again, &format!("{what}: second read"));
    }

    // Ops on the restored tensor, each compared with plain Flex; after each the tensor is
    // spilled again and still reads back the same.
    for op in OPS {
        if !applies(&case.source, op) {
            continue;
        }
        let (source, plain_source) = (case.source.clone(), case.source.clone());
        let inner_what = format!("{what}: {op}");
        let expected_read = expected.clone();
        compare(
            &inner_what.clone(),
            move || {
                vec![
                    T::<Plain>::make(&plain_source, &Default::default())
                        .apply(op)
                        .unwrap(),
                ]
            },
            move || {
                let (t, _other) = spilled(&source, tier, &inner_what);
                let out = t.apply(op).unwrap();
                assert_eq!(residency(&t), tier, "{inner_what}: after the op");
                assert_same_data(
                    &expected_read,
                    &t.read(),
                    &format!("{inner_what}: read after the op"),
                );
                vec![out]
            },
        );
    }

    let after = Spill::stats(&dev);
    let live = Spill::live(&dev);
    assert_eq!(
        (live.tensors, live.bytes),
        (0, 0),
        "{what}: tensors left alive"
    );
    assert_eq!(
        (
            after.resident.device,
            after.resident.host,
            after.resident.disk
        ),
        (0, 0, 0),
        "{what}: bytes left on a tier"
    );
    assert!(
        after.device_to_host.count > before.device_to_host.count,
        "{what}: nothing spilled"
    );
    match tier {
        Tier::Host => {
            assert!(
                after.host_to_device.count > before.host_to_device.count,
                "{what}: no restore from host"
            );
            assert_eq!(
                after.host_to_disk.count, before.host_to_disk.count,
                "{what}: went to disk"
            );
        }
        Tier::Disk => {
            assert!(
                after.host_to_disk.count > before.host_to_disk.count,
                "{what}: nothing went to disk"
            );
            assert!(
                after.disk_to_device.count > before.disk_to_device.count,
                "{what}: no restore from disk"
            );
        }
        Tier::Device => unreachable!(),
    }
    assert_eq!(
        after.disk_write_errors, before.disk_write_errors,
        "{what}: disk write errors"
    );
}

/// The ops of [`OPS`] that plain Flex rejects (panics on) for `case`.
fn flex_rejects(case: &Case) -> Vec<(&'static str, &'static str)> {
    OPS.into_iter()
        .filter(|op| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                T::<Plain>::make(&case.source, &Default::default()).apply(op)
            }))
            .is_err()
        })
        .map(|op| (case.name, op))
        .collect()
}

fn through(tier: Tier) {
    let cases = cases();
    let mut failures = Vec::new();
    for case in &cases {
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| round_trip(case, tier)));
        if let Err(e) = result {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {msg}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} dtypes failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn every_dtype_is_exact_through_the_host_tier() {
    through(Tier::Host);
}

#[test]
fn every_dtype_is_exact_through_the_disk_tier() {
    through(Tier::Disk);
}

#[test]
fn flex_rejects_only_the_known_dtype_ops() {
    let _device = ExclusiveDevice::take();
    let rejected: Vec<_> = cases().iter().flat_map(flex_rejects).collect();
    assert_eq!(rejected, FLEX_REJECTS);
}

/// The name a case is listed under; exhaustive, so a new `DType` in Burn asks for a case.
fn dtype_name(dtype: DType) -> String {
    match dtype {
        DType::QFloat(_) => "QFloat".to_string(),
        DType::F64
        | DType::F32
        | DType::Flex32
        | DType::F16
        | DType::BF16
        | DType::I64
        | DType::I32
        | DType::I16
        | DType::I8
        | DType::U64
        | DType::U32
        | DType::U16
        | DType::U8
        | DType::Bool(_) => format!("{dtype:?}"),
    }
}

#[test]
fn the_cases_cover_every_dtype_of_burn() {
    let dev = Default::default();
    let made: Vec<String> = cases()
        .iter()
        .map(|c| dtype_name(T::<Plain>::make(&c.source, &dev).dtype()))
        .collect();
    for name in [
        "F64",
        "F32",
        "Flex32",
        "F16",
        "BF16",
        "I64",
        "I32",
        "I16",
        "I8",
        "U64",
        "U32",
        "U16",
        "U8",
        "Bool(Native)",
        "Bool(U8)",
        "Bool(U32)",
        "QFloat",
    ] {
        assert!(
            made.iter().any(|s| s == name),
            "no case makes a {name} tensor (made: {made:?})"
        );
    }
}

/// A training set-up in a float dtype the inner backend lacks (Flex has no `Flex32`) fails
/// through burn-spill exactly as on the backend: the device refuses it as its default dtype
/// with the same error, and nothing is locked (a later valid setting is still taken).
#[test]
fn a_default_dtype_the_backend_lacks_is_refused_as_on_the_backend() {
    use burn::tensor::FloatDType;
    use burn::tensor::backend::set_default_float_dtype;
    let device = Default::default();
    let plain = set_default_float_dtype::<Plain>(&device, FloatDType::Flex32).unwrap_err();
    let spilled = set_default_float_dtype::<Spill>(&device, FloatDType::Flex32).unwrap_err();
    assert_eq!(format!("{spilled:?}"), format!("{plain:?}"));
}
