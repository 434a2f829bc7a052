//! Every method of `FloatTensorOps`, `IntTensorOps` and `BoolTensorOps`, called directly as a
//! backend trait method on plain Flex and on `SpillBackend<Flex>`: the outputs must be
//! bit-identical (dtype, shape, bytes), or both backends must panic with the same message.
//!
//! Float families run in f32, f16 and bf16; int families in i32 and i64; bool in the device's
//! default bool dtype. Inputs are small and hand-written so every result means something
//! (positive inputs for log/sqrt, (-1, 1) for asin/atanh, distinct values for sort/argmax...).

mod common;

use burn::tensor::backend::Backend;
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor};
use burn::tensor::{BoolDType, FloatDType, IntDType, TensorData, get_device_settings};
use common::{Coverage, read_bool, read_float, read_int};

// ---------------------------------------------------------------------------------------------
// Inputs (all exactly representable in f16 and bf16, so the three dtypes see the same values).
// ---------------------------------------------------------------------------------------------

/// Mixed signs, including a zero and ties for rounding (0.5, -2.5).
const MIXED: [f32; 6] = [-2.5, -1.25, 0.0, 0.5, 1.75, 3.0];
/// Strictly positive: log, sqrt, recip, powf.
const POS: [f32; 6] = [0.5, 1.0, 1.5, 2.0, 3.0, 4.5];
/// Inside (-1, 1): asin, acos, atanh, tan.
const UNIT: [f32; 6] = [-0.75, -0.5, -0.125, 0.0, 0.25, 0.625];
/// At least 1: acosh.
const GE1: [f32; 6] = [1.0, 1.25, 1.5, 2.0, 3.0, 4.0];
/// Second operand for binary ops: no zeros (div, remainder), some equal to `MIXED`.
const OTHER: [f32; 6] = [1.5, -1.25, 2.0, 0.5, -0.75, 1.0];
/// Distinct in every row and every column of a [2, 3] view: sort, argmax, topk have no ties.
const DISTINCT: [f32; 6] = [0.25, -1.5, 3.0, 2.5, -0.75, 1.0];

/// Ints: mixed signs, no zero divisors in `INT_OTHER`.
const INTS: [i64; 6] = [7, -7, 9, -9, 5, 0];
const INT_OTHER: [i64; 6] = [2, 2, -4, -4, 3, 1];
/// Distinct per row and column of a [2, 3] view.
const INT_DISTINCT: [i64; 6] = [4, -2, 9, 8, 1, -5];

/// Bool pattern.
const BOOLS: [bool; 6] = [true, false, false, true, true, false];
const BOOLS_OTHER: [bool; 6] = [true, true, false, false, true, false];

const FLOAT_DTYPES: [FloatDType; 3] = [FloatDType::F32, FloatDType::F16, FloatDType::BF16];
const INT_DTYPES: [IntDType; 2] = [IntDType::I32, IntDType::I64];

// ---------------------------------------------------------------------------------------------
// Helpers (generic free fns, callable from inside `diff!` cases).
// ---------------------------------------------------------------------------------------------

/// A float tensor of dtype `dt` from f32 values.
fn ft<B: Backend>(v: &[f32], shape: &[usize], dt: FloatDType, dev: &B::Device) -> FloatTensor<B> {
    let data = TensorData::new(v.to_vec(), shape.to_vec()).convert_dtype(dt.into());
    B::float_from_data(data, dev)
}

/// An f32 tensor.
fn f32s<B: Backend>(v: &[f32], shape: &[usize], dev: &B::Device) -> FloatTensor<B> {
    ft::<B>(v, shape, FloatDType::F32, dev)
}

/// An int tensor of dtype `dt` from i64 values.
fn it<B: Backend>(v: &[i64], shape: &[usize], dt: IntDType, dev: &B::Device) -> IntTensor<B> {
    let data = TensorData::new(v.to_vec(), shape.to_vec()).convert_dtype(dt.into());
    B::int_from_data(data, dev)
}

/// An int tensor of the device's default int dtype (indices).
fn idx<B: Backend>(v: &[i64], shape: &[usize], dev: &B::Device) -> IntTensor<B> {
    it::<B>(v, shape, int_dt::<B>(dev), dev)
}

/// A bool tensor of the device's default bool dtype.
fn bt<B: Backend>(v: &[bool], shape: &[usize], dev: &B::Device) -> BoolTensor<B> {
    let data = TensorData::new(v.to_vec(), shape.to_vec()).convert_dtype(bool_dt::<B>(dev).into());
    B::bool_from_data(data, dev)
}

fn bool_dt<B: Backend>(dev: &B::Device) -> BoolDType {
    get_device_settings::<B>(dev).bool_dtype
}

fn int_dt<B: Backend>(dev: &B::Device) -> IntDType {
    get_device_settings::<B>(dev).int_dtype
}

/// Runs `f` once per float dtype and concatenates the outputs.
fn per_float(f: impl Fn(FloatDType) -> Vec<TensorData>) -> Vec<TensorData> {
    FLOAT_DTYPES.iter().flat_map(|&dt| f(dt)).collect()
}

/// Runs `f` once per int dtype and concatenates the outputs.
fn per_int(f: impl Fn(IntDType) -> Vec<TensorData>) -> Vec<TensorData> {
    INT_DTYPES.iter().flat_map(|&dt| f(dt)).collect()
}

/// Keeps only dtype and shape of a read (for `*_empty`, whose bytes are uninitialised).
fn meta(d: TensorData) -> TensorData {
    TensorData::full_dtype(d.shape.clone(), 0i32, d.dtype)
}

/// A scalar flag as data, so it takes part in the comparison.
fn flag(b: bool) -> TensorData {
    TensorData::from([b])
}

/// One float unary op per case, over the three float dtypes, on a [2, 3] input.
macro_rules! float_unary {
    ($cov:expr, $input:expr => $($op:ident),+ $(,)?) => {$(
        diff!($cov, [$op], |B, dev| {
            per_float(|dt| vec![read_float::<B>(B::$op(ft::<B>(&$input, &[2, 3], dt, dev)))])
        });
    )+};
}

// ---------------------------------------------------------------------------------------------
// The test.
// ---------------------------------------------------------------------------------------------

#[test]
fn every_float_int_bool_op_matches_flex() {
    let cov = Coverage::default();

    float_creation(&cov);
    float_arithmetic(&cov);
    float_math(&cov);
    float_layout(&cov);
    float_indexing(&cov);
    float_comparison(&cov);
    float_reduction(&cov);
    float_ordering(&cov);

    int_creation(&cov);
    int_arithmetic(&cov);
    int_bitwise(&cov);
    int_layout(&cov);
    int_indexing(&cov);
    int_comparison(&cov);
    int_reduction(&cov);
    int_ordering(&cov);

    bool_creation(&cov);
    bool_logic(&cov);
    bool_layout(&cov);
    bool_indexing(&cov);
    bool_reduction(&cov);

    shared_handles(&cov);

    cov.assert_covers(common::op_list::FLOAT_OPS);
    cov.assert_covers(common::op_list::INT_OPS);
    cov.assert_covers(common::op_list::BOOL_OPS);
}

// ---------------------------------------------------------------------------------------------
// Float.
// ---------------------------------------------------------------------------------------------

/// Creation, reads, device, autodiff flags, conversions.
fn float_creation(cov: &Coverage) {
    diff!(cov, [float_from_data, float_into_data], |B, dev| {
        let mut out = per_float(|dt| vec![read_float::<B>(ft::<B>(&MIXED, &[2, 3], dt, dev))]);
        // f64 as well, straight from f64 data.
        let d = TensorData::new(vec![1.0f64, -2.0, 0.125], [3]);
        out.push(burn::tensor::read_sync(B::float_into_data(B::float_from_data(d, dev))).unwrap());
        out
    });
    diff!(cov, [float_zeros, float_ones, float_full], |B, dev| {
        per_float(|dt| {
            vec![
                read_float::<B>(B::float_zeros([2, 3].into(), dev, dt)),
                read_float::<B>(B::float_ones([2, 3].into(), dev, dt)),
                read_float::<B>(B::float_full([2, 3].into(), 2.5f64.into(), dev, dt)),
            ]
        })
    });
    // Uninitialised bytes: dtype and shape only.
    diff!(cov, [float_empty], |B, dev| {
        per_float(|dt| {
            vec![meta(read_float::<B>(B::float_empty(
                [2, 3].into(),
                dev,
                dt,
            )))]
        })
    });
    // Each backend is seeded right before its own draw, so the numbers must match too.
    diff!(cov, [float_random], |B, dev| {
        use burn::tensor::Distribution;
        per_float(|dt| {
            [
                Distribution::Default,
                Distribution::Uniform(-2.0, 2.0),
                Distribution::Normal(0.0, 1.0),
                Distribution::Bernoulli(0.5),
            ]
            .into_iter()
            .map(|dist| {
                B::seed(dev, 42);
                read_float::<B>(B::float_random([4, 5].into(), dist, dev, dt))
            })
            .collect()
        })
    });
    diff!(cov, [float_device, float_to_device], |B, dev| {
        per_float(|dt| {
            let a = ft::<B>(&MIXED, &[2, 3], dt, dev);
            let same = B::float_device(&a) == *dev;
            let moved = B::float_to_device(a, dev);
            vec![
                flag(same),
                flag(B::float_device(&moved) == *dev),
                read_float::<B>(moved),
            ]
        })
    });
    diff!(
        cov,
        [float_detach, float_set_require_grad, float_is_require_grad],
        |B, dev| {
            per_float(|dt| {
                let a = ft::<B>(&MIXED, &[2, 3], dt, dev);
                let before = B::float_is_require_grad(&a);
                let a = B::float_set_require_grad(a, true);
                let marked = B::float_is_require_grad(&a);
                let a = B::float_detach(a);
                let detached = B::float_is_require_grad(&a);
                vec![
                    flag(before),
                    flag(marked),
                    flag(detached),
                    read_float::<B>(a),
                ]
            })
        }
    );
    diff!(cov, [float_into_int], |B, dev| {
        per_float(|dt| {
            INT_DTYPES
                .iter()
                .map(|&it| read_int::<B>(B::float_into_int(ft::<B>(&MIXED, &[2, 3], dt, dev), it)))
                .collect()
        })
    });
    diff!(cov, [float_cast], |B, dev| {
        // Every source dtype to every target dtype (f64 included).
        let all = [
            FloatDType::F32,
            FloatDType::F16,
            FloatDType::BF16,
            FloatDType::F64,
        ];
        let mut out = Vec::new();
        for &from in &FLOAT_DTYPES {
            for &to in &all {
                let a = ft::<B>(&[0.1, -3.3, 1000.7, 1e-3, 65504.0, -0.0], &[6], from, dev);
                out.push(read_float::<B>(B::float_cast(a, to)));
            }
        }
        out
    });
}

/// Elementwise binary and scalar arithmetic, clamps, matmul, cross, powers.
fn float_arithmetic(cov: &Coverage) {
    diff!(
        cov,
        [float_add, float_sub, float_mul, float_div, float_remainder],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&MIXED, &[2, 3], dt, dev);
                let b = || ft::<B>(&OTHER, &[2, 3], dt, dev);
                // A broadcast right-hand side too.
                let row = || ft::<B>(&[2.0, -0.5, 4.0], &[1, 3], dt, dev);
                vec![
                    read_float::<B>(B::float_add(a(), b())),
                    read_float::<B>(B::float_sub(a(), b())),
                    read_float::<B>(B::float_mul(a(), b())),
                    read_float::<B>(B::float_div(a(), b())),
                    read_float::<B>(B::float_remainder(a(), b())),
                    read_float::<B>(B::float_add(a(), row())),
                    read_float::<B>(B::float_mul(row(), a())),
                ]
            })
        }
    );
    diff!(
        cov,
        [
            float_add_scalar,
            float_sub_scalar,
            float_mul_scalar,
            float_div_scalar,
            float_remainder_scalar
        ],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&MIXED, &[2, 3], dt, dev);
                vec![
                    read_float::<B>(B::float_add_scalar(a(), 1.5f64.into())),
                    read_float::<B>(B::float_sub_scalar(a(), 0.25f64.into())),
                    read_float::<B>(B::float_mul_scalar(a(), (-3.0f64).into())),
                    read_float::<B>(B::float_div_scalar(a(), 4.0f64.into())),
                    read_float::<B>(B::float_remainder_scalar(a(), 1.5f64.into())),
                    read_float::<B>(B::float_remainder_scalar(a(), (-2.0f64).into())),
                ]
            })
        }
    );
    diff!(
        cov,
        [float_clamp_min, float_clamp_max, float_clamp],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&MIXED, &[2, 3], dt, dev);
                vec![
                    read_float::<B>(B::float_clamp_min(a(), (-1.0f64).into())),
                    read_float::<B>(B::float_clamp_max(a(), 1.0f64.into())),
                    read_float::<B>(B::float_clamp(a(), (-1.0f64).into(), 1.5f64.into())),
                ]
            })
        }
    );
    diff!(cov, [float_matmul], |B, dev| {
        per_float(|dt| {
            let a = ft::<B>(&MIXED, &[2, 3], dt, dev);
            let b = ft::<B>(&OTHER, &[3, 2], dt, dev);
            // Batched, with broadcast over the batch dimension.
            let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
            let c = ft::<B>(&x, &[2, 2, 3], dt, dev);
            let d = ft::<B>(&OTHER, &[1, 3, 2], dt, dev);
            vec![
                read_float::<B>(B::float_matmul(a, b)),
                read_float::<B>(B::float_matmul(c, d)),
            ]
        })
    });
    diff!(cov, [float_cross], |B, dev| {
        per_float(|dt| {
            let a = ft::<B>(&MIXED, &[2, 3], dt, dev);
            let b = ft::<B>(&OTHER, &[2, 3], dt, dev);
            let c = ft::<B>(&MIXED, &[3, 2], dt, dev);
            let d = ft::<B>(&POS, &[3, 2], dt, dev);
            vec![
                read_float::<B>(B::float_cross(a, b, 1)),
                read_float::<B>(B::float_cross(c, d, 0)),
            ]
        })
    });
    diff!(cov, [float_powf, float_powi], |B, dev| {
        per_float(|dt| {
            let base = || ft::<B>(&POS, &[2, 3], dt, dev);
            let e = ft::<B>(&[2.0, 0.5, -1.0, 3.0, 1.5, 0.0], &[2, 3], dt, dev);
            let ei = idx::<B>(&[2, 3, -1, 0, 1, 4], &[2, 3], dev);
            vec![
                read_float::<B>(B::float_powf(base(), e)),
                read_float::<B>(B::float_powi(base(), ei)),
            ]
        })
    });
    // Exponents picked to go through every branch of the default `powi_scalar` (0, 1, 2, -1,
    // -2, other) and of `powf_scalar` (integral and not).
    diff!(
        cov,
        [
            float_powi_scalar,
            float_powi_scalar_impl,
            float_powf_scalar,
            float_powf_scalar_impl
        ],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&MIXED, &[2, 3], dt, dev);
                let p = || ft::<B>(&POS, &[2, 3], dt, dev);
                let mut out: Vec<TensorData> = [0i64, 1, 2, -1, -2, 3]
                    .iter()
                    .map(|&n| read_float::<B>(B::float_powi_scalar(p(), n.into())))
                    .collect();
                out.push(read_float::<B>(B::float_powi_scalar_impl(a(), 3i64.into())));
                out.push(read_float::<B>(B::float_powf_scalar(a(), 2.0f64.into())));
                out.push(read_float::<B>(B::float_powf_scalar(p(), 2.5f64.into())));
                out.push(read_float::<B>(B::float_powf_scalar_impl(
                    p(),
                    (-0.5f64).into(),
                )));
                out
            })
        }
    );
}

/// Unary math (plus atan2 and the NaN/inf tests).
fn float_math(cov: &Coverage) {
    float_unary!(cov, MIXED => float_neg, float_abs, float_sign, float_exp, float_cos, float_sin,
        float_cosh, float_sinh, float_tanh, float_asinh, float_atan, float_erf, float_round,
        float_floor, float_ceil, float_trunc);
    float_unary!(cov, POS => float_recip, float_log, float_log1p, float_sqrt);
    float_unary!(cov, UNIT => float_tan, float_acos, float_asin, float_atanh);
    float_unary!(cov, GE1 => float_acosh);
    // More rounding ties and fractions than MIXED has.
    diff!(
        cov,
        [float_round, float_floor, float_ceil, float_trunc],
        |B, dev| {
            per_float(|dt| {
                let v = [
                    -3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -0.75, 0.75, 2.25, -2.25,
                ];
                let a = || ft::<B>(&v, &[12], dt, dev);
                vec![
                    read_float::<B>(B::float_round(a())),
                    read_float::<B>(B::float_floor(a())),
                    read_float::<B>(B::float_ceil(a())),
                    read_float::<B>(B::float_trunc(a())),
                ]
            })
        }
    );
    diff!(cov, [float_atan2], |B, dev| {
        per_float(|dt| {
            let y = ft::<B>(&MIXED, &[2, 3], dt, dev);
            let x = ft::<B>(&OTHER, &[2, 3], dt, dev);
            vec![read_float::<B>(B::float_atan2(y, x))]
        })
    });
    diff!(cov, [float_is_nan, float_is_inf], |B, dev| {
        per_float(|dt| {
            let v = [f32::NAN, f32::INFINITY, -1.0, f32::NEG_INFINITY, 0.0, 2.5];
            let a = || ft::<B>(&v, &[2, 3], dt, dev);
            vec![
                read_bool::<B>(B::float_is_nan(a(), bool_dt::<B>(dev))),
                read_bool::<B>(B::float_is_inf(a(), bool_dt::<B>(dev))),
            ]
        })
    });
}

/// Shape and layout: transpose, permute, flip, reshape, expand, repeat, cat, slice, unfold.
fn float_layout(cov: &Coverage) {
    diff!(
        cov,
        [float_transpose, float_swap_dims, float_permute, float_flip],
        |B, dev| {
            per_float(|dt| {
                let x: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 6.0).collect();
                let a = || ft::<B>(&x, &[2, 3, 4], dt, dev);
                vec![
                    read_float::<B>(B::float_transpose(a())),
                    read_float::<B>(B::float_swap_dims(a(), 0, 2)),
                    read_float::<B>(B::float_permute(a(), &[1, 2, 0])),
                    read_float::<B>(B::float_flip(a(), &[0, 2])),
                    // A layout op on top of another one (non-contiguous input).
                    read_float::<B>(B::float_flip(B::float_permute(a(), &[2, 0, 1]), &[1])),
                ]
            })
        }
    );
    diff!(
        cov,
        [float_reshape, float_expand, float_repeat_dim],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&MIXED, &[2, 3], dt, dev);
                vec![
                    read_float::<B>(B::float_reshape(a(), [3, 2].into())),
                    read_float::<B>(B::float_reshape(a(), [6].into())),
                    read_float::<B>(B::float_expand(
                        ft::<B>(&[1.0, 2.0, 3.0], &[1, 3], dt, dev),
                        [4, 3].into(),
                    )),
                    read_float::<B>(B::float_expand(
                        ft::<B>(&[1.0, 2.0], &[2, 1], dt, dev),
                        [2, 2, 5].into(),
                    )),
                    read_float::<B>(B::float_repeat_dim(a(), 0, 3)),
                    read_float::<B>(B::float_repeat_dim(a(), 1, 2)),
                ]
            })
        }
    );
    diff!(cov, [float_cat], |B, dev| {
        per_float(|dt| {
            let a = || ft::<B>(&MIXED, &[2, 3], dt, dev);
            let b = || ft::<B>(&POS[..3], &[1, 3], dt, dev);
            let c = || ft::<B>(&UNIT[..4], &[2, 2], dt, dev);
            vec![
                read_float::<B>(B::float_cat(vec![a(), b(), a()], 0)),
                read_float::<B>(B::float_cat(vec![a(), c()], 1)),
            ]
        })
    });
    diff!(cov, [float_slice, float_slice_assign], |B, dev| {
        use burn::tensor::Slice;
        per_float(|dt| {
            let x: Vec<f32> = (0..12).map(|i| i as f32 - 4.0).collect();
            let a = || ft::<B>(&x, &[3, 4], dt, dev);
            let v = ft::<B>(&[9.0, 8.0, 7.0, 6.0], &[2, 2], dt, dev);
            vec![
                read_float::<B>(B::float_slice(
                    a(),
                    &[Slice::new(1, Some(3), 1), Slice::new(0, None, 2)],
                )),
                read_float::<B>(B::float_slice(
                    a(),
                    &[Slice::new(-2, None, 1), Slice::new(1, Some(-1), 1)],
                )),
                read_float::<B>(B::float_slice_assign(
                    a(),
                    &[Slice::new(1, Some(3), 1), Slice::new(1, Some(3), 1)],
                    v,
                )),
            ]
        })
    });
    // Negative steps on their own, so a rejection cannot hide the plain slices above.
    diff!(cov, [float_slice], |B, dev| {
        use burn::tensor::Slice;
        per_float(|dt| {
            let x: Vec<f32> = (0..12).map(|i| i as f32 - 4.0).collect();
            let a = ft::<B>(&x, &[3, 4], dt, dev);
            vec![read_float::<B>(B::float_slice(
                a,
                &[Slice::new(0, None, -1), Slice::new(0, None, -2)],
            ))]
        })
    });
    diff!(cov, [float_unfold], |B, dev| {
        per_float(|dt| {
            let x: Vec<f32> = (0..10).map(|i| i as f32 * 0.5).collect();
            let a = || ft::<B>(&x, &[2, 5], dt, dev);
            vec![
                read_float::<B>(B::float_unfold(a(), 1, 2, 2)),
                read_float::<B>(B::float_unfold(a(), 1, 3, 1)),
                read_float::<B>(B::float_unfold(a(), 0, 1, 1)),
            ]
        })
    });
}

/// Gather, scatter, select, masks, and the n-d gather/scatter.
fn float_indexing(cov: &Coverage) {
    diff!(cov, [float_gather, float_scatter_add], |B, dev| {
        per_float(|dt| {
            let a = ft::<B>(&MIXED, &[2, 3], dt, dev);
            let i = || idx::<B>(&[2, 0, 0, 1, 2, 1], &[2, 3], dev);
            let zeros = ft::<B>(&[0.0; 6], &[2, 3], dt, dev);
            let v = ft::<B>(&POS, &[2, 3], dt, dev);
            vec![
                read_float::<B>(B::float_gather(1, a, i())),
                // Index 0 and index 1 of row 0/1 hit twice: the adds accumulate.
                read_float::<B>(B::float_scatter_add(1, zeros, i(), v)),
            ]
        })
    });
    diff!(cov, [float_select, float_select_add], |B, dev| {
        per_float(|dt| {
            let a = || ft::<B>(&MIXED, &[3, 2], dt, dev);
            let i = || idx::<B>(&[2, 0, 2], &[3], dev);
            let v = ft::<B>(&POS, &[3, 2], dt, dev);
            vec![
                read_float::<B>(B::float_select(a(), 0, i())),
                read_float::<B>(B::float_select(a(), 1, idx::<B>(&[1, 1, 0], &[3], dev))),
                read_float::<B>(B::float_select_add(a(), 0, i(), v)),
            ]
        })
    });
    diff!(cov, [float_mask_where, float_mask_fill], |B, dev| {
        per_float(|dt| {
            let a = || ft::<B>(&MIXED, &[2, 3], dt, dev);
            let m = || bt::<B>(&BOOLS, &[2, 3], dev);
            let v = ft::<B>(&POS, &[2, 3], dt, dev);
            vec![
                read_float::<B>(B::float_mask_where(a(), m(), v)),
                read_float::<B>(B::float_mask_fill(a(), m(), (-9.5f64).into())),
            ]
        })
    });
    // Burn's default body is `unimplemented!`; Flex overrides them. Either way both must agree.
    diff!(cov, [float_gather_nd], |B, dev| {
        per_float(|dt| {
            let data = || ft::<B>(&MIXED, &[3, 2], dt, dev);
            vec![
                read_float::<B>(B::float_gather_nd(data(), idx::<B>(&[2, 0], &[2, 1], dev))),
                read_float::<B>(B::float_gather_nd(
                    data(),
                    idx::<B>(&[0, 1, 2, 0], &[2, 2], dev),
                )),
            ]
        })
    });
    diff!(cov, [float_scatter_nd], |B, dev| {
        use burn::tensor::IndexingUpdateOp;
        per_float(|dt| {
            let data = || ft::<B>(&MIXED, &[3, 2], dt, dev);
            let i = || idx::<B>(&[2, 0], &[2, 1], dev);
            let v = || ft::<B>(&[1.0, 2.0, 3.0, 4.0], &[2, 2], dt, dev);
            [
                IndexingUpdateOp::Assign,
                IndexingUpdateOp::Add,
                IndexingUpdateOp::Mul,
                IndexingUpdateOp::Min,
                IndexingUpdateOp::Max,
            ]
            .into_iter()
            .map(|op| read_float::<B>(B::float_scatter_nd(data(), i(), v(), op)))
            .collect()
        })
    });
}

/// The twelve comparisons.
fn float_comparison(cov: &Coverage) {
    diff!(
        cov,
        [
            float_equal,
            float_not_equal,
            float_greater,
            float_greater_equal,
            float_lower,
            float_lower_equal
        ],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&MIXED, &[2, 3], dt, dev);
                let b = || ft::<B>(&[-2.5, 0.0, 0.0, 1.0, 1.75, -3.0], &[2, 3], dt, dev);
                let bd = bool_dt::<B>(dev);
                vec![
                    read_bool::<B>(B::float_equal(a(), b(), bd)),
                    read_bool::<B>(B::float_not_equal(a(), b(), bd)),
                    read_bool::<B>(B::float_greater(a(), b(), bd)),
                    read_bool::<B>(B::float_greater_equal(a(), b(), bd)),
                    read_bool::<B>(B::float_lower(a(), b(), bd)),
                    read_bool::<B>(B::float_lower_equal(a(), b(), bd)),
                ]
            })
        }
    );
    diff!(
        cov,
        [
            float_equal_elem,
            float_not_equal_elem,
            float_greater_elem,
            float_greater_equal_elem,
            float_lower_elem,
            float_lower_equal_elem
        ],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&MIXED, &[2, 3], dt, dev);
                let bd = bool_dt::<B>(dev);
                let s = || burn::tensor::Scalar::from(0.5f64);
                vec![
                    read_bool::<B>(B::float_equal_elem(a(), s(), bd)),
                    read_bool::<B>(B::float_not_equal_elem(a(), s(), bd)),
                    read_bool::<B>(B::float_greater_elem(a(), s(), bd)),
                    read_bool::<B>(B::float_greater_equal_elem(a(), s(), bd)),
                    read_bool::<B>(B::float_lower_elem(a(), s(), bd)),
                    read_bool::<B>(B::float_lower_equal_elem(a(), s(), bd)),
                ]
            })
        }
    );
}

/// Sums, products, means, cumulatives, any/all.
fn float_reduction(cov: &Coverage) {
    diff!(
        cov,
        [
            float_sum,
            float_sum_dim,
            float_prod,
            float_prod_dim,
            float_mean,
            float_mean_dim
        ],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&MIXED, &[2, 3], dt, dev);
                vec![
                    read_float::<B>(B::float_sum(a())),
                    read_float::<B>(B::float_sum_dim(a(), 0)),
                    read_float::<B>(B::float_sum_dim(a(), 1)),
                    read_float::<B>(B::float_prod(ft::<B>(&POS, &[2, 3], dt, dev))),
                    read_float::<B>(B::float_prod_dim(a(), 0)),
                    read_float::<B>(B::float_prod_dim(a(), 1)),
                    read_float::<B>(B::float_mean(a())),
                    read_float::<B>(B::float_mean_dim(a(), 0)),
                    read_float::<B>(B::float_mean_dim(a(), 1)),
                ]
            })
        }
    );
    diff!(
        cov,
        [float_cumsum, float_cumprod, float_cummin, float_cummax],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&DISTINCT, &[2, 3], dt, dev);
                let mut out = Vec::new();
                for dim in 0..2 {
                    out.push(read_float::<B>(B::float_cumsum(a(), dim)));
                    out.push(read_float::<B>(B::float_cumprod(a(), dim)));
                    out.push(read_float::<B>(B::float_cummin(a(), dim)));
                    out.push(read_float::<B>(B::float_cummax(a(), dim)));
                }
                out
            })
        }
    );
    diff!(
        cov,
        [float_any, float_any_dim, float_all, float_all_dim],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&[0.0, 0.0, 0.0, 1.5, 0.0, -2.0], &[2, 3], dt, dev);
                let bd = bool_dt::<B>(dev);
                vec![
                    read_bool::<B>(B::float_any(a(), bd)),
                    read_bool::<B>(B::float_any(ft::<B>(&[0.0; 4], &[4], dt, dev), bd)),
                    read_bool::<B>(B::float_any_dim(a(), 0, bd)),
                    read_bool::<B>(B::float_any_dim(a(), 1, bd)),
                    read_bool::<B>(B::float_all(a(), bd)),
                    read_bool::<B>(B::float_all(ft::<B>(&POS, &[6], dt, dev), bd)),
                    read_bool::<B>(B::float_all_dim(
                        ft::<B>(&[1.0, 0.0, 2.0, 3.0, 4.0, 5.0], &[2, 3], dt, dev),
                        0,
                        bd,
                    )),
                    read_bool::<B>(B::float_all_dim(a(), 1, bd)),
                ]
            })
        }
    );
}

/// Max/min/arg*, topk, sort, grid sampling.
fn float_ordering(cov: &Coverage) {
    diff!(cov, [float_argmax, float_argmin, float_topk], |B, dev| {
        per_float(|dt| {
            let a = || ft::<B>(&DISTINCT, &[2, 3], dt, dev);
            let id = int_dt::<B>(dev);
            vec![
                read_int::<B>(B::float_argmax(a(), 0, id)),
                read_int::<B>(B::float_argmax(a(), 1, IntDType::I64)),
                read_int::<B>(B::float_argmin(a(), 0, IntDType::I64)),
                read_int::<B>(B::float_argmin(a(), 1, id)),
                read_float::<B>(B::float_topk(a(), 1, 2)),
                read_float::<B>(B::float_topk(a(), 0, 2)),
            ]
        })
    });
    // Flex 0.21 rejects argtopk (`unimplemented!`): on its own, so the panic hides nothing
    // else; burn-spill must panic with the same message.
    diff!(cov, [float_argtopk], |B, dev| {
        per_float(|dt| {
            let a = || ft::<B>(&DISTINCT, &[2, 3], dt, dev);
            vec![
                read_int::<B>(B::float_argtopk(a(), 1, 2, int_dt::<B>(dev))),
                read_int::<B>(B::float_argtopk(a(), 0, 1, IntDType::I64)),
            ]
        })
    });
    diff!(
        cov,
        [
            float_max,
            float_max_dim,
            float_max_dim_with_indices,
            float_min,
            float_min_dim,
            float_min_dim_with_indices,
            float_max_abs,
            float_max_abs_dim
        ],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&DISTINCT, &[2, 3], dt, dev);
                let id = int_dt::<B>(dev);
                let (mv, mi) = B::float_max_dim_with_indices(a(), 1, id);
                let (nv, ni) = B::float_min_dim_with_indices(a(), 0, id);
                vec![
                    read_float::<B>(B::float_max(a())),
                    read_float::<B>(B::float_max_dim(a(), 0)),
                    read_float::<B>(B::float_max_dim(a(), 1)),
                    read_float::<B>(mv),
                    read_int::<B>(mi),
                    read_float::<B>(B::float_min(a())),
                    read_float::<B>(B::float_min_dim(a(), 0)),
                    read_float::<B>(B::float_min_dim(a(), 1)),
                    read_float::<B>(nv),
                    read_int::<B>(ni),
                    // |-1.5| > 1.0, |-2.5|... : the abs max is not the max.
                    read_float::<B>(B::float_max_abs(ft::<B>(&MIXED, &[2, 3], dt, dev))),
                    read_float::<B>(B::float_max_abs_dim(ft::<B>(&MIXED, &[2, 3], dt, dev), 1)),
                    read_float::<B>(B::float_max_abs_dim(a(), 0)),
                ]
            })
        }
    );
    diff!(
        cov,
        [float_sort, float_sort_with_indices, float_argsort],
        |B, dev| {
            per_float(|dt| {
                let a = || ft::<B>(&DISTINCT, &[2, 3], dt, dev);
                let id = int_dt::<B>(dev);
                let mut out = Vec::new();
                for dim in 0..2 {
                    for desc in [false, true] {
                        out.push(read_float::<B>(B::float_sort(a(), dim, desc)));
                        let (v, i) = B::float_sort_with_indices(a(), dim, desc, id);
                        out.push(read_float::<B>(v));
                        out.push(read_int::<B>(i));
                        out.push(read_int::<B>(B::float_argsort(
                            a(),
                            dim,
                            desc,
                            IntDType::I64,
                        )));
                    }
                }
                out
            })
        }
    );
    diff!(cov, [float_grid_sample_2d], |B, dev| {
        use burn::tensor::ops::{GridSampleOptions, GridSamplePaddingMode, InterpolateMode};
        per_float(|dt| {
            let x: Vec<f32> = (0..18).map(|i| i as f32 * 0.5).collect();
            let img = || ft::<B>(&x, &[1, 2, 3, 3], dt, dev);
            let g = [
                -1.0, -1.0, 0.5, -0.25, 0.0, 0.0, 1.0, 0.75, -0.5, 1.0, 1.25, -1.25,
            ];
            let grid = || ft::<B>(&g, &[1, 2, 3, 2], dt, dev);
            let aligned = GridSampleOptions {
                mode: InterpolateMode::Bilinear,
                padding_mode: GridSamplePaddingMode::Border,
                align_corners: true,
            };
            vec![
                read_float::<B>(B::float_grid_sample_2d(
                    img(),
                    grid(),
                    GridSampleOptions::default(),
                )),
                read_float::<B>(B::float_grid_sample_2d(img(), grid(), aligned)),
            ]
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Int.
// ---------------------------------------------------------------------------------------------

/// Creation, reads, device, conversions, random and arange.
fn int_creation(cov: &Coverage) {
    diff!(cov, [int_from_data, int_into_data], |B, dev| {
        per_int(|dt| vec![read_int::<B>(it::<B>(&INTS, &[2, 3], dt, dev))])
    });
    diff!(cov, [int_zeros, int_ones, int_full], |B, dev| {
        per_int(|dt| {
            vec![
                read_int::<B>(B::int_zeros([2, 3].into(), dev, dt)),
                read_int::<B>(B::int_ones([2, 3].into(), dev, dt)),
                read_int::<B>(B::int_full([2, 3].into(), (-7i64).into(), dev, dt)),
            ]
        })
    });
    diff!(cov, [int_empty], |B, dev| {
        per_int(|dt| vec![meta(read_int::<B>(B::int_empty([2, 3].into(), dev, dt)))])
    });
    // Seeded right before each draw on each backend.
    diff!(cov, [int_random], |B, dev| {
        use burn::tensor::Distribution;
        per_int(|dt| {
            [
                Distribution::Uniform(-10.0, 10.0),
                Distribution::Bernoulli(0.5),
                Distribution::Default,
            ]
            .into_iter()
            .map(|dist| {
                B::seed(dev, 7);
                read_int::<B>(B::int_random([4, 5].into(), dist, dev, dt))
            })
            .collect()
        })
    });
    diff!(cov, [int_arange, int_arange_step], |B, dev| {
        per_int(|dt| {
            vec![
                read_int::<B>(B::int_arange(0..6, dev, dt)),
                read_int::<B>(B::int_arange(-3..4, dev, dt)),
                read_int::<B>(B::int_arange_step(0..10, 3, dev, dt)),
                read_int::<B>(B::int_arange_step(-5..5, 2, dev, dt)),
            ]
        })
    });
    diff!(cov, [int_device, int_to_device], |B, dev| {
        per_int(|dt| {
            let a = it::<B>(&INTS, &[2, 3], dt, dev);
            let same = B::int_device(&a) == *dev;
            let moved = B::int_to_device(a, dev);
            vec![
                flag(same),
                flag(B::int_device(&moved) == *dev),
                read_int::<B>(moved),
            ]
        })
    });
    diff!(cov, [int_into_float], |B, dev| {
        per_int(|dt| {
            FLOAT_DTYPES
                .iter()
                .map(|&ft_| {
                    read_float::<B>(B::int_into_float(it::<B>(&INTS, &[2, 3], dt, dev), ft_))
                })
                .collect()
        })
    });
    diff!(cov, [int_cast], |B, dev| {
        let all = [
            IntDType::I64,
            IntDType::I32,
            IntDType::I16,
            IntDType::I8,
            IntDType::U8,
        ];
        let mut out = Vec::new();
        for &from in &INT_DTYPES {
            for &to in &all {
                let a = it::<B>(&[1, 127, 300, 70000, 3, 0], &[6], from, dev);
                out.push(read_int::<B>(B::int_cast(a, to)));
            }
        }
        // And back up from a narrow type.
        let n = B::int_cast(it::<B>(&INTS, &[6], IntDType::I32, dev), IntDType::I16);
        out.push(read_int::<B>(B::int_cast(n, IntDType::I64)));
        out
    });
}

/// Arithmetic, powers, clamps, matmul, abs/sign/neg.
fn int_arithmetic(cov: &Coverage) {
    diff!(
        cov,
        [int_add, int_sub, int_mul, int_div, int_remainder],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&INTS, &[2, 3], dt, dev);
                let b = || it::<B>(&INT_OTHER, &[2, 3], dt, dev);
                let row = || it::<B>(&[3, -2, 5], &[1, 3], dt, dev);
                vec![
                    read_int::<B>(B::int_add(a(), b())),
                    read_int::<B>(B::int_sub(a(), b())),
                    read_int::<B>(B::int_mul(a(), b())),
                    read_int::<B>(B::int_div(a(), b())),
                    read_int::<B>(B::int_remainder(a(), b())),
                    read_int::<B>(B::int_sub(a(), row())),
                    read_int::<B>(B::int_div(a(), row())),
                ]
            })
        }
    );
    diff!(
        cov,
        [
            int_add_scalar,
            int_sub_scalar,
            int_mul_scalar,
            int_div_scalar,
            int_remainder_scalar
        ],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&INTS, &[2, 3], dt, dev);
                vec![
                    read_int::<B>(B::int_add_scalar(a(), 3i64.into())),
                    read_int::<B>(B::int_sub_scalar(a(), (-4i64).into())),
                    read_int::<B>(B::int_mul_scalar(a(), (-3i64).into())),
                    read_int::<B>(B::int_div_scalar(a(), 2i64.into())),
                    read_int::<B>(B::int_div_scalar(a(), (-4i64).into())),
                    read_int::<B>(B::int_remainder_scalar(a(), 4i64.into())),
                    read_int::<B>(B::int_remainder_scalar(a(), (-3i64).into())),
                ]
            })
        }
    );
    diff!(
        cov,
        [int_powi, int_powi_scalar, int_powi_scalar_impl],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&[2, -3, 4, -1, 0, 5], &[2, 3], dt, dev);
                let e = it::<B>(&[3, 2, 0, 5, 2, 1], &[2, 3], dt, dev);
                let mut out = vec![read_int::<B>(B::int_powi(a(), e))];
                for n in [0i64, 1, 2, 3] {
                    out.push(read_int::<B>(B::int_powi_scalar(a(), n.into())));
                }
                out.push(read_int::<B>(B::int_powi_scalar_impl(a(), 3i64.into())));
                out
            })
        }
    );
    diff!(cov, [int_clamp_min, int_clamp_max, int_clamp], |B, dev| {
        per_int(|dt| {
            let a = || it::<B>(&INTS, &[2, 3], dt, dev);
            vec![
                read_int::<B>(B::int_clamp_min(a(), (-5i64).into())),
                read_int::<B>(B::int_clamp_max(a(), 6i64.into())),
                read_int::<B>(B::int_clamp(a(), (-5i64).into(), 6i64.into())),
            ]
        })
    });
    diff!(cov, [int_matmul], |B, dev| {
        per_int(|dt| {
            let a = it::<B>(&INTS, &[2, 3], dt, dev);
            let b = it::<B>(&INT_OTHER, &[3, 2], dt, dev);
            let c = it::<B>(&[1, 2, 3, 4, 5, 6, 7, 8], &[2, 2, 2], dt, dev);
            let d = it::<B>(&[1, -1, 2, 0], &[1, 2, 2], dt, dev);
            vec![
                read_int::<B>(B::int_matmul(a, b)),
                read_int::<B>(B::int_matmul(c, d)),
            ]
        })
    });
    diff!(cov, [int_neg, int_abs, int_sign], |B, dev| {
        per_int(|dt| {
            let a = || it::<B>(&INTS, &[2, 3], dt, dev);
            vec![
                read_int::<B>(B::int_neg(a())),
                read_int::<B>(B::int_abs(a())),
                read_int::<B>(B::int_sign(a())),
            ]
        })
    });
}

/// Bitwise ops and shifts.
fn int_bitwise(cov: &Coverage) {
    diff!(
        cov,
        [
            bitwise_and,
            bitwise_or,
            bitwise_xor,
            bitwise_not,
            bitwise_left_shift,
            bitwise_right_shift
        ],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&[12, -7, 255, 0, 1023, -1], &[2, 3], dt, dev);
                let b = || it::<B>(&[10, 3, 15, -1, 512, 6], &[2, 3], dt, dev);
                let s = || it::<B>(&[0, 1, 2, 3, 4, 5], &[2, 3], dt, dev);
                vec![
                    read_int::<B>(B::bitwise_and(a(), b())),
                    read_int::<B>(B::bitwise_or(a(), b())),
                    read_int::<B>(B::bitwise_xor(a(), b())),
                    read_int::<B>(B::bitwise_not(a())),
                    read_int::<B>(B::bitwise_left_shift(a(), s())),
                    read_int::<B>(B::bitwise_right_shift(a(), s())),
                ]
            })
        }
    );
    diff!(
        cov,
        [
            bitwise_and_scalar,
            bitwise_or_scalar,
            bitwise_xor_scalar,
            bitwise_left_shift_scalar,
            bitwise_right_shift_scalar
        ],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&[12, -7, 255, 0, 1023, -1], &[2, 3], dt, dev);
                vec![
                    read_int::<B>(B::bitwise_and_scalar(a(), 6i64.into())),
                    read_int::<B>(B::bitwise_or_scalar(a(), 5i64.into())),
                    read_int::<B>(B::bitwise_xor_scalar(a(), 9i64.into())),
                    read_int::<B>(B::bitwise_left_shift_scalar(a(), 3i64.into())),
                    read_int::<B>(B::bitwise_right_shift_scalar(a(), 2i64.into())),
                ]
            })
        }
    );
}

/// Shape and layout.
fn int_layout(cov: &Coverage) {
    diff!(
        cov,
        [int_transpose, int_swap_dims, int_permute, int_flip],
        |B, dev| {
            per_int(|dt| {
                let x: Vec<i64> = (0..24).map(|i| i * 3 - 30).collect();
                let a = || it::<B>(&x, &[2, 3, 4], dt, dev);
                vec![
                    read_int::<B>(B::int_transpose(a())),
                    read_int::<B>(B::int_swap_dims(a(), 0, 1)),
                    read_int::<B>(B::int_permute(a(), &[2, 0, 1])),
                    read_int::<B>(B::int_flip(a(), &[1])),
                    read_int::<B>(B::int_flip(B::int_transpose(a()), &[0, 2])),
                ]
            })
        }
    );
    diff!(
        cov,
        [int_reshape, int_expand, int_repeat_dim, int_cat],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&INTS, &[2, 3], dt, dev);
                vec![
                    read_int::<B>(B::int_reshape(a(), [3, 2].into())),
                    read_int::<B>(B::int_expand(
                        it::<B>(&[1, 2, 3], &[1, 3], dt, dev),
                        [3, 3].into(),
                    )),
                    read_int::<B>(B::int_repeat_dim(a(), 1, 3)),
                    read_int::<B>(B::int_cat(
                        vec![a(), it::<B>(&[4, 5, 6], &[1, 3], dt, dev)],
                        0,
                    )),
                    read_int::<B>(B::int_cat(vec![a(), a()], 1)),
                ]
            })
        }
    );
    diff!(cov, [int_slice, int_slice_assign, int_unfold], |B, dev| {
        use burn::tensor::Slice;
        per_int(|dt| {
            let x: Vec<i64> = (0..12).map(|i| i * 2 - 7).collect();
            let a = || it::<B>(&x, &[3, 4], dt, dev);
            let v = it::<B>(&[100, 200, 300], &[1, 3], dt, dev);
            vec![
                read_int::<B>(B::int_slice(
                    a(),
                    &[Slice::new(0, Some(2), 1), Slice::new(1, None, 2)],
                )),
                read_int::<B>(B::int_slice_assign(
                    a(),
                    &[Slice::new(2, Some(3), 1), Slice::new(0, Some(3), 1)],
                    v,
                )),
                read_int::<B>(B::int_unfold(a(), 1, 2, 1)),
                read_int::<B>(B::int_unfold(a(), 0, 2, 2)),
            ]
        })
    });
}

/// Gather, scatter, select, masks, n-d gather/scatter.
fn int_indexing(cov: &Coverage) {
    diff!(
        cov,
        [int_gather, int_scatter_add, int_select, int_select_add],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&INTS, &[2, 3], dt, dev);
                let i = || idx::<B>(&[2, 0, 0, 1, 2, 1], &[2, 3], dev);
                let v = || it::<B>(&[1, 2, 3, 4, 5, 6], &[2, 3], dt, dev);
                vec![
                    read_int::<B>(B::int_gather(1, a(), i())),
                    read_int::<B>(B::int_scatter_add(1, a(), i(), v())),
                    read_int::<B>(B::int_select(a(), 1, idx::<B>(&[2, 2, 0, 1], &[4], dev))),
                    read_int::<B>(B::int_select_add(a(), 0, idx::<B>(&[1, 1], &[2], dev), v())),
                ]
            })
        }
    );
    diff!(cov, [int_mask_where, int_mask_fill], |B, dev| {
        per_int(|dt| {
            let a = || it::<B>(&INTS, &[2, 3], dt, dev);
            let m = || bt::<B>(&BOOLS, &[2, 3], dev);
            vec![
                read_int::<B>(B::int_mask_where(
                    a(),
                    m(),
                    it::<B>(&INT_OTHER, &[2, 3], dt, dev),
                )),
                read_int::<B>(B::int_mask_fill(a(), m(), (-42i64).into())),
            ]
        })
    });
    // Burn's default body is `unimplemented!`: same result or same panic.
    diff!(cov, [int_gather_nd], |B, dev| {
        per_int(|dt| {
            let data = it::<B>(&INTS, &[3, 2], dt, dev);
            vec![read_int::<B>(B::int_gather_nd(
                data,
                idx::<B>(&[2, 0], &[2, 1], dev),
            ))]
        })
    });
    diff!(cov, [int_scatter_nd], |B, dev| {
        use burn::tensor::IndexingUpdateOp;
        per_int(|dt| {
            let data = it::<B>(&INTS, &[3, 2], dt, dev);
            let v = it::<B>(&[1, 2, 3, 4], &[2, 2], dt, dev);
            let i = idx::<B>(&[2, 0], &[2, 1], dev);
            vec![read_int::<B>(B::int_scatter_nd(
                data,
                i,
                v,
                IndexingUpdateOp::Add,
            ))]
        })
    });
}

/// The twelve comparisons.
fn int_comparison(cov: &Coverage) {
    diff!(
        cov,
        [
            int_equal,
            int_not_equal,
            int_greater,
            int_greater_equal,
            int_lower,
            int_lower_equal
        ],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&INTS, &[2, 3], dt, dev);
                let b = || it::<B>(&[7, 0, 9, -10, 6, 0], &[2, 3], dt, dev);
                let bd = bool_dt::<B>(dev);
                vec![
                    read_bool::<B>(B::int_equal(a(), b(), bd)),
                    read_bool::<B>(B::int_not_equal(a(), b(), bd)),
                    read_bool::<B>(B::int_greater(a(), b(), bd)),
                    read_bool::<B>(B::int_greater_equal(a(), b(), bd)),
                    read_bool::<B>(B::int_lower(a(), b(), bd)),
                    read_bool::<B>(B::int_lower_equal(a(), b(), bd)),
                ]
            })
        }
    );
    diff!(
        cov,
        [
            int_equal_elem,
            int_not_equal_elem,
            int_greater_elem,
            int_greater_equal_elem,
            int_lower_elem,
            int_lower_equal_elem
        ],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&INTS, &[2, 3], dt, dev);
                let bd = bool_dt::<B>(dev);
                let s = || burn::tensor::Scalar::from(5i64);
                vec![
                    read_bool::<B>(B::int_equal_elem(a(), s(), bd)),
                    read_bool::<B>(B::int_not_equal_elem(a(), s(), bd)),
                    read_bool::<B>(B::int_greater_elem(a(), s(), bd)),
                    read_bool::<B>(B::int_greater_equal_elem(a(), s(), bd)),
                    read_bool::<B>(B::int_lower_elem(a(), s(), bd)),
                    read_bool::<B>(B::int_lower_equal_elem(a(), s(), bd)),
                ]
            })
        }
    );
}

/// Sums, products, means, cumulatives, any/all.
fn int_reduction(cov: &Coverage) {
    diff!(
        cov,
        [
            int_sum,
            int_sum_dim,
            int_prod,
            int_prod_dim,
            int_mean,
            int_mean_dim
        ],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&INTS, &[2, 3], dt, dev);
                let p = || it::<B>(&[2, -3, 4, 1, 5, -1], &[2, 3], dt, dev);
                vec![
                    read_int::<B>(B::int_sum(a())),
                    read_int::<B>(B::int_sum_dim(a(), 0)),
                    read_int::<B>(B::int_sum_dim(a(), 1)),
                    read_int::<B>(B::int_prod(p())),
                    read_int::<B>(B::int_prod_dim(p(), 0)),
                    read_int::<B>(B::int_prod_dim(p(), 1)),
                    // 5 / 6 and -18 / 6 ... integer means truncate.
                    read_int::<B>(B::int_mean(a())),
                    read_int::<B>(B::int_mean(p())),
                    read_int::<B>(B::int_mean_dim(a(), 0)),
                    read_int::<B>(B::int_mean_dim(p(), 1)),
                ]
            })
        }
    );
    diff!(
        cov,
        [int_cumsum, int_cumprod, int_cummin, int_cummax],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&INT_DISTINCT, &[2, 3], dt, dev);
                let mut out = Vec::new();
                for dim in 0..2 {
                    out.push(read_int::<B>(B::int_cumsum(a(), dim)));
                    out.push(read_int::<B>(B::int_cumprod(a(), dim)));
                    out.push(read_int::<B>(B::int_cummin(a(), dim)));
                    out.push(read_int::<B>(B::int_cummax(a(), dim)));
                }
                out
            })
        }
    );
    diff!(
        cov,
        [int_any, int_any_dim, int_all, int_all_dim],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&[0, 0, 0, 3, 0, -1], &[2, 3], dt, dev);
                let bd = bool_dt::<B>(dev);
                vec![
                    read_bool::<B>(B::int_any(a(), bd)),
                    read_bool::<B>(B::int_any(it::<B>(&[0, 0], &[2], dt, dev), bd)),
                    read_bool::<B>(B::int_any_dim(a(), 0, bd)),
                    read_bool::<B>(B::int_any_dim(a(), 1, bd)),
                    read_bool::<B>(B::int_all(a(), bd)),
                    read_bool::<B>(B::int_all(it::<B>(&[1, -2, 3], &[3], dt, dev), bd)),
                    read_bool::<B>(B::int_all_dim(
                        it::<B>(&[1, 0, 2, 3, 4, 5], &[2, 3], dt, dev),
                        0,
                        bd,
                    )),
                    read_bool::<B>(B::int_all_dim(a(), 1, bd)),
                ]
            })
        }
    );
}

/// Max/min/arg*, topk, sort.
fn int_ordering(cov: &Coverage) {
    diff!(
        cov,
        [
            int_argmax,
            int_argmin,
            int_topk,
            int_max,
            int_max_dim,
            int_max_dim_with_indices,
            int_min,
            int_min_dim,
            int_min_dim_with_indices,
            int_max_abs,
            int_max_abs_dim
        ],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&INT_DISTINCT, &[2, 3], dt, dev);
                let (mv, mi) = B::int_max_dim_with_indices(a(), 0);
                let (nv, ni) = B::int_min_dim_with_indices(a(), 1);
                vec![
                    read_int::<B>(B::int_argmax(a(), 0)),
                    read_int::<B>(B::int_argmax(a(), 1)),
                    read_int::<B>(B::int_argmin(a(), 0)),
                    read_int::<B>(B::int_argmin(a(), 1)),
                    read_int::<B>(B::int_topk(a(), 1, 2)),
                    read_int::<B>(B::int_topk(a(), 0, 1)),
                    read_int::<B>(B::int_max(a())),
                    read_int::<B>(B::int_max_dim(a(), 1)),
                    read_int::<B>(mv),
                    read_int::<B>(mi),
                    read_int::<B>(B::int_min(a())),
                    read_int::<B>(B::int_min_dim(a(), 0)),
                    read_int::<B>(nv),
                    read_int::<B>(ni),
                    // |-9| beats 7: abs max differs from max.
                    read_int::<B>(B::int_max_abs(it::<B>(&INTS, &[2, 3], dt, dev))),
                    read_int::<B>(B::int_max_abs_dim(a(), 1)),
                ]
            })
        }
    );
    // Rejected by Flex 0.21 like `float_argtopk`: on its own.
    diff!(cov, [int_argtopk], |B, dev| {
        per_int(|dt| {
            let a = || it::<B>(&INT_DISTINCT, &[2, 3], dt, dev);
            vec![
                read_int::<B>(B::int_argtopk(a(), 1, 2)),
                read_int::<B>(B::int_argtopk(a(), 0, 1)),
            ]
        })
    });
    diff!(
        cov,
        [int_sort, int_sort_with_indices, int_argsort],
        |B, dev| {
            per_int(|dt| {
                let a = || it::<B>(&INT_DISTINCT, &[2, 3], dt, dev);
                let mut out = Vec::new();
                for dim in 0..2 {
                    for desc in [false, true] {
                        out.push(read_int::<B>(B::int_sort(a(), dim, desc)));
                        let (v, i) = B::int_sort_with_indices(a(), dim, desc);
                        out.push(read_int::<B>(v));
                        out.push(read_int::<B>(i));
                        out.push(read_int::<B>(B::int_argsort(a(), dim, desc)));
                    }
                }
                out
            })
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Bool.
// ---------------------------------------------------------------------------------------------

/// Creation, reads, device, conversions.
fn bool_creation(cov: &Coverage) {
    diff!(cov, [bool_from_data, bool_into_data], |B, dev| {
        vec![read_bool::<B>(bt::<B>(&BOOLS, &[2, 3], dev))]
    });
    diff!(cov, [bool_zeros, bool_ones], |B, dev| {
        let bd = bool_dt::<B>(dev);
        vec![
            read_bool::<B>(B::bool_zeros([2, 3].into(), dev, bd)),
            read_bool::<B>(B::bool_ones([2, 3].into(), dev, bd)),
        ]
    });
    diff!(cov, [bool_empty], |B, dev| {
        vec![meta(read_bool::<B>(B::bool_empty(
            [2, 3].into(),
            dev,
            bool_dt::<B>(dev),
        )))]
    });
    diff!(cov, [bool_device, bool_to_device], |B, dev| {
        let a = bt::<B>(&BOOLS, &[2, 3], dev);
        let same = B::bool_device(&a) == *dev;
        let moved = B::bool_to_device(a, dev);
        vec![
            flag(same),
            flag(B::bool_device(&moved) == *dev),
            read_bool::<B>(moved),
        ]
    });
    diff!(cov, [bool_into_int, bool_into_float], |B, dev| {
        let a = || bt::<B>(&BOOLS, &[2, 3], dev);
        let mut out: Vec<TensorData> = INT_DTYPES
            .iter()
            .map(|&d| read_int::<B>(B::bool_into_int(a(), d)))
            .collect();
        out.extend(
            FLOAT_DTYPES
                .iter()
                .map(|&d| read_float::<B>(B::bool_into_float(a(), d))),
        );
        out
    });
}

/// Logic and comparisons.
fn bool_logic(cov: &Coverage) {
    diff!(
        cov,
        [
            bool_not,
            bool_and,
            bool_or,
            bool_xor,
            bool_equal,
            bool_not_equal
        ],
        |B, dev| {
            let a = || bt::<B>(&BOOLS, &[2, 3], dev);
            let b = || bt::<B>(&BOOLS_OTHER, &[2, 3], dev);
            vec![
                read_bool::<B>(B::bool_not(a())),
                read_bool::<B>(B::bool_and(a(), b())),
                read_bool::<B>(B::bool_or(a(), b())),
                read_bool::<B>(B::bool_xor(a(), b())),
                read_bool::<B>(B::bool_equal(a(), b())),
                read_bool::<B>(B::bool_not_equal(a(), b())),
                // Broadcast right-hand side.
                read_bool::<B>(B::bool_and(
                    a(),
                    bt::<B>(&[true, false, true], &[1, 3], dev),
                )),
            ]
        }
    );
    diff!(cov, [bool_equal_elem, bool_not_equal_elem], |B, dev| {
        let a = || bt::<B>(&BOOLS, &[2, 3], dev);
        vec![
            read_bool::<B>(B::bool_equal_elem(a(), true.into())),
            read_bool::<B>(B::bool_equal_elem(a(), false.into())),
            read_bool::<B>(B::bool_not_equal_elem(a(), true.into())),
        ]
    });
}

/// Shape and layout.
fn bool_layout(cov: &Coverage) {
    diff!(
        cov,
        [bool_transpose, bool_swap_dims, bool_permute, bool_flip],
        |B, dev| {
            let x: Vec<bool> = (0..24).map(|i| i % 3 == 0 || i % 7 == 1).collect();
            let a = || bt::<B>(&x, &[2, 3, 4], dev);
            vec![
                read_bool::<B>(B::bool_transpose(a())),
                read_bool::<B>(B::bool_swap_dims(a(), 0, 2)),
                read_bool::<B>(B::bool_permute(a(), &[1, 0, 2])),
                read_bool::<B>(B::bool_flip(a(), &[0, 1])),
            ]
        }
    );
    diff!(
        cov,
        [bool_reshape, bool_expand, bool_repeat_dim, bool_cat],
        |B, dev| {
            let a = || bt::<B>(&BOOLS, &[2, 3], dev);
            vec![
                read_bool::<B>(B::bool_reshape(a(), [3, 2].into())),
                read_bool::<B>(B::bool_expand(
                    bt::<B>(&[true, false], &[2, 1], dev),
                    [2, 4].into(),
                )),
                read_bool::<B>(B::bool_repeat_dim(a(), 0, 2)),
                read_bool::<B>(B::bool_cat(
                    vec![a(), bt::<B>(&BOOLS_OTHER, &[2, 3], dev)],
                    1,
                )),
                read_bool::<B>(B::bool_cat(
                    vec![a(), bt::<B>(&[false, true, true], &[1, 3], dev)],
                    0,
                )),
            ]
        }
    );
    diff!(
        cov,
        [bool_slice, bool_slice_assign, bool_unfold],
        |B, dev| {
            use burn::tensor::Slice;
            let x: Vec<bool> = (0..12).map(|i| i % 3 != 1).collect();
            let a = || bt::<B>(&x, &[3, 4], dev);
            let v = bt::<B>(&[true, true, false, true], &[2, 2], dev);
            vec![
                read_bool::<B>(B::bool_slice(
                    a(),
                    &[Slice::new(1, None, 1), Slice::new(0, Some(4), 3)],
                )),
                read_bool::<B>(B::bool_slice_assign(
                    a(),
                    &[Slice::new(0, Some(2), 1), Slice::new(2, Some(4), 1)],
                    v,
                )),
                read_bool::<B>(B::bool_unfold(a(), 1, 2, 2)),
                read_bool::<B>(B::bool_unfold(a(), 0, 2, 1)),
            ]
        }
    );
}

/// Masks, gather/scatter-or, select/select-or, argwhere.
fn bool_indexing(cov: &Coverage) {
    diff!(cov, [bool_mask_where, bool_mask_fill], |B, dev| {
        let a = || bt::<B>(&BOOLS, &[2, 3], dev);
        let m = || bt::<B>(&BOOLS_OTHER, &[2, 3], dev);
        vec![
            read_bool::<B>(B::bool_mask_where(
                a(),
                m(),
                bt::<B>(&[false; 6], &[2, 3], dev),
            )),
            read_bool::<B>(B::bool_mask_fill(a(), m(), false.into())),
            read_bool::<B>(B::bool_mask_fill(a(), m(), true.into())),
        ]
    });
    diff!(cov, [bool_gather, bool_scatter_or], |B, dev| {
        let a = || bt::<B>(&BOOLS, &[2, 3], dev);
        let i = || idx::<B>(&[2, 0, 0, 1, 2, 1], &[2, 3], dev);
        vec![
            read_bool::<B>(B::bool_gather(1, a(), i())),
            read_bool::<B>(B::bool_scatter_or(
                1,
                bt::<B>(&[false; 6], &[2, 3], dev),
                i(),
                a(),
            )),
        ]
    });
    diff!(cov, [bool_select, bool_select_or], |B, dev| {
        let a = || bt::<B>(&BOOLS, &[3, 2], dev);
        let i = || idx::<B>(&[2, 0, 2], &[3], dev);
        vec![
            read_bool::<B>(B::bool_select(a(), 0, i())),
            read_bool::<B>(B::bool_select(a(), 1, idx::<B>(&[1, 0, 1], &[3], dev))),
            read_bool::<B>(B::bool_select_or(
                bt::<B>(&[false; 6], &[3, 2], dev),
                0,
                i(),
                bt::<B>(&BOOLS_OTHER, &[3, 2], dev),
            )),
        ]
    });
    // `bool_argwhere` returns a future of the tensor itself.
    diff!(cov, [bool_argwhere], |B, dev| {
        let a = || bt::<B>(&BOOLS, &[2, 3], dev);
        vec![
            read_int::<B>(burn::tensor::read_sync(B::bool_argwhere(
                a(),
                int_dt::<B>(dev),
            ))),
            read_int::<B>(burn::tensor::read_sync(B::bool_argwhere(
                a(),
                IntDType::I64,
            ))),
            read_int::<B>(burn::tensor::read_sync(B::bool_argwhere(
                bt::<B>(&[false; 4], &[4], dev),
                int_dt::<B>(dev),
            ))),
        ]
    });
}

/// any/all.
fn bool_reduction(cov: &Coverage) {
    diff!(
        cov,
        [bool_any, bool_any_dim, bool_all, bool_all_dim],
        |B, dev| {
            let a = || bt::<B>(&[false, false, false, true, false, true], &[2, 3], dev);
            vec![
                read_bool::<B>(B::bool_any(a())),
                read_bool::<B>(B::bool_any(bt::<B>(&[false; 3], &[3], dev))),
                read_bool::<B>(B::bool_any_dim(a(), 0)),
                read_bool::<B>(B::bool_any_dim(a(), 1)),
                read_bool::<B>(B::bool_all(a())),
                read_bool::<B>(B::bool_all(bt::<B>(&[true; 3], &[3], dev))),
                read_bool::<B>(B::bool_all_dim(
                    bt::<B>(&[true, false, true, true, true, true], &[2, 3], dev),
                    0,
                )),
                read_bool::<B>(B::bool_all_dim(a(), 1)),
            ]
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Shared handles: a clone taken before an op that consumes the original must keep the old
// values (the op may reuse a uniquely owned buffer in place, never a shared one).
// ---------------------------------------------------------------------------------------------

fn shared_handles(cov: &Coverage) {
    diff!(cov, [float_add_scalar, float_exp, float_add], |B, dev| {
        per_float(|dt| {
            let a = ft::<B>(&MIXED, &[2, 3], dt, dev);
            let a2 = a.clone();
            let r1 = B::float_add_scalar(a, 10.0f64.into());
            let a3 = a2.clone();
            let r2 = B::float_exp(a2);
            // The same handle on both sides of a binary op.
            let r3 = B::float_add(a3.clone(), a3.clone());
            vec![
                read_float::<B>(r1),
                read_float::<B>(r2),
                read_float::<B>(r3),
                read_float::<B>(a3),
            ]
        })
    });
    diff!(
        cov,
        [
            float_slice_assign,
            float_mask_fill,
            float_scatter_add,
            float_select_add
        ],
        |B, dev| {
            use burn::tensor::Slice;
            per_float(|dt| {
                let a = ft::<B>(&MIXED, &[2, 3], dt, dev);
                let keep = a.clone();
                let v = ft::<B>(&[7.0, 8.0], &[1, 2], dt, dev);
                let r1 = B::float_slice_assign(
                    a.clone(),
                    &[Slice::new(0, Some(1), 1), Slice::new(1, Some(3), 1)],
                    v,
                );
                let r2 =
                    B::float_mask_fill(a.clone(), bt::<B>(&BOOLS, &[2, 3], dev), 0.0f64.into());
                let i = idx::<B>(&[0, 0, 1, 1, 2, 2], &[2, 3], dev);
                let r3 = B::float_scatter_add(1, a.clone(), i, ft::<B>(&POS, &[2, 3], dt, dev));
                let r4 = B::float_select_add(
                    a,
                    0,
                    idx::<B>(&[1], &[1], dev),
                    ft::<B>(&POS[..3], &[1, 3], dt, dev),
                );
                vec![
                    read_float::<B>(r1),
                    read_float::<B>(r2),
                    read_float::<B>(r3),
                    read_float::<B>(r4),
                    read_float::<B>(keep),
                ]
            })
        }
    );
    // A view (reshape, transpose) of a shared buffer, then an op on the view.
    diff!(
        cov,
        [float_reshape, float_transpose, float_mul_scalar],
        |B, dev| {
            let a = f32s::<B>(&MIXED, &[2, 3], dev);
            let keep = a.clone();
            let v = B::float_transpose(B::float_reshape(a, [3, 2].into()));
            let view_keep = v.clone();
            let r = B::float_mul_scalar(v, 2.0f64.into());
            vec![
                read_float::<B>(r),
                read_float::<B>(view_keep),
                read_float::<B>(keep),
            ]
        }
    );
    diff!(
        cov,
        [int_add_scalar, int_neg, int_slice_assign],
        |B, dev| {
            use burn::tensor::Slice;
            per_int(|dt| {
                let a = it::<B>(&INTS, &[2, 3], dt, dev);
                let keep = a.clone();
                let r1 = B::int_add_scalar(a.clone(), 100i64.into());
                let r2 = B::int_neg(a.clone());
                let v = it::<B>(&[-1, -2, -3], &[1, 3], dt, dev);
                let r3 = B::int_slice_assign(a, &[Slice::new(1, Some(2), 1), Slice::full()], v);
                vec![
                    read_int::<B>(r1),
                    read_int::<B>(r2),
                    read_int::<B>(r3),
                    read_int::<B>(keep),
                ]
            })
        }
    );
    diff!(cov, [bool_not, bool_mask_fill, bool_or], |B, dev| {
        let a = bt::<B>(&BOOLS, &[2, 3], dev);
        let keep = a.clone();
        let r1 = B::bool_not(a.clone());
        let r2 = B::bool_mask_fill(a.clone(), bt::<B>(&BOOLS_OTHER, &[2, 3], dev), true.into());
        let r3 = B::bool_or(a, keep.clone());
        vec![
            read_bool::<B>(r1),
            read_bool::<B>(r2),
            read_bool::<B>(r3),
            read_bool::<B>(keep),
        ]
    });
}
