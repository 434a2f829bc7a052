//! Differential test of every `ModuleOps`, `ActivationOps`, `QTensorOps`, `TransactionOps` and
//! `Backend` method: each is called directly as a backend trait method, generic over the backend,
//! on plain Flex and on `SpillBackend<Flex>`, and the outputs must be bit-identical (or both
//! sides must panic with the same message).

mod common;

use burn::tensor::backend::Backend;
// The module option types and `TransactionPrimitive` come into each case from the `diff!`
// macro's `use burn::tensor::ops::*`.
use burn::tensor::ops::{BoolTensor, FloatTensor, FloatTensorOps, IntTensor, QuantizedTensor};
use burn::tensor::quantization::{
    BlockSize, QTensorPrimitive, QuantLevel, QuantScheme, QuantStore, QuantValue,
    QuantizationParametersPrimitive,
};
use burn::tensor::{
    BoolDType, BoolStore, DType, Distribution, FloatDType, IntDType, Scalar, Shape, Slice,
    TensorData, TensorPrimitive, bf16, f16,
};
use burn_spill::TensorRole;
use common::op_list::{
    ACTIVATION_OPS, BACKEND_METHODS, MODULE_OPS, QUANTIZED_OPS, TRANSACTION_OPS,
};
use common::{Coverage, Plain, Spill, assert_same_data, read_bool, read_float, read_int, read_q};

// ---------------------------------------------------------------------------------------------
// Deterministic inputs
// ---------------------------------------------------------------------------------------------

/// `n` distinct multiples of 1/16 in [-3.125, 3.125] (a permutation of 101 values, so no ties
/// for n <= 101); `salt` picks a different permutation start.
fn vals(n: usize, salt: usize) -> Vec<f32> {
    assert!(n <= 101);
    (0..n)
        .map(|i| (((i * 37 + salt * 11) % 101) as f32 - 50.0) / 16.0)
        .collect()
}

/// Strictly positive distinct values in [0.25, ~6.5].
fn pos_vals(n: usize, salt: usize) -> Vec<f32> {
    vals(n, salt).into_iter().map(|v| v + 3.375).collect()
}

fn fdata(v: Vec<f32>, shape: &[usize]) -> TensorData {
    TensorData::new(v, shape.to_vec())
}

/// Float tensor of distinct values.
fn ft<B: Backend>(shape: &[usize], salt: usize, dev: &B::Device) -> FloatTensor<B> {
    let n = shape.iter().product();
    B::float_from_data(fdata(vals(n, salt), shape), dev)
}

/// Float tensor of strictly positive distinct values.
fn fpos<B: Backend>(shape: &[usize], salt: usize, dev: &B::Device) -> FloatTensor<B> {
    let n = shape.iter().product();
    B::float_from_data(fdata(pos_vals(n, salt), shape), dev)
}

fn fv<B: Backend>(v: Vec<f32>, shape: &[usize], dev: &B::Device) -> FloatTensor<B> {
    B::float_from_data(fdata(v, shape), dev)
}

/// Half-precision float tensor (f16).
fn fh<B: Backend>(shape: &[usize], salt: usize, dev: &B::Device) -> FloatTensor<B> {
    let n = shape.iter().product();
    B::float_from_data(fdata(vals(n, salt), shape).convert::<f16>(), dev)
}

/// bfloat16 float tensor.
fn fbf<B: Backend>(shape: &[usize], salt: usize, dev: &B::Device) -> FloatTensor<B> {
    let n = shape.iter().product();
    B::float_from_data(fdata(vals(n, salt), shape).convert::<bf16>(), dev)
}

fn it<B: Backend>(v: Vec<i32>, shape: &[usize], dev: &B::Device) -> IntTensor<B> {
    B::int_from_data(TensorData::new(v, shape.to_vec()), dev)
}

fn bt<B: Backend>(v: Vec<bool>, shape: &[usize], dev: &B::Device) -> BoolTensor<B> {
    B::bool_from_data(TensorData::new(v, shape.to_vec()), dev)
}

/// A string as a comparable `TensorData` (bytes).
fn text(s: &str) -> TensorData {
    TensorData::new(s.as_bytes().to_vec(), [s.len()])
}

fn flag(b: bool) -> TensorData {
    TensorData::from([b as i32])
}

/// Reads what a `q_*` op returned: a float or a quantized tensor.
fn read_prim<B: Backend>(p: TensorPrimitive<B>) -> TensorData {
    match p {
        TensorPrimitive::Float(f) => read_float::<B>(f),
        TensorPrimitive::QFloat(q) => read_q::<B>(q),
    }
}

/// The backend's default quantization scheme (Flex: Q8F, native i8 store, per tensor).
fn default_scheme<B: Backend>() -> QuantScheme {
    <B::QuantizedTensorPrimitive as QTensorPrimitive>::default_scheme()
}

/// A symmetric Q8S per-block scheme (blocks of 4 elements) that Flex accepts.
fn block_scheme() -> QuantScheme {
    QuantScheme::default()
        .with_value(QuantValue::Q8S)
        .with_level(QuantLevel::Block(BlockSize::new([4])))
        .with_store(QuantStore::Native)
}

/// `[3, 4]` values with pairwise distinct values and absolute values (no ties for arg ops).
fn q_input() -> Vec<f32> {
    vec![
        0.5, -2.25, 1.75, -0.25, -1.5, 3.0, -0.75, 2.5, 1.25, -1.0, 2.0, -2.75,
    ]
}

fn qt<B: Backend>(dev: &B::Device) -> QuantizedTensor<B> {
    B::quantize_dynamic(fv::<B>(q_input(), &[3, 4], dev), &default_scheme::<B>())
}

/// A second `[3, 4]` quantized tensor, strictly positive (safe divisor, log, sqrt, powf base).
fn qpos<B: Backend>(salt: usize, dev: &B::Device) -> QuantizedTensor<B> {
    B::quantize_dynamic(fpos::<B>(&[3, 4], salt, dev), &default_scheme::<B>())
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

#[test]
fn every_module_activation_quant_op_matches_flex() {
    let cov = Coverage::default();
    module_convs(&cov);
    module_pools(&cov);
    module_misc(&cov);
    activations(&cov);
    quantized(&cov);
    transaction(&cov);
    backend_methods(&cov);
    cov.assert_covers(MODULE_OPS);
    cov.assert_covers(ACTIVATION_OPS);
    cov.assert_covers(QUANTIZED_OPS);
    cov.assert_covers(TRANSACTION_OPS);
    cov.assert_covers(BACKEND_METHODS);
}

// ---------------------------------------------------------------------------------------------
// ModuleOps: convolutions
// ---------------------------------------------------------------------------------------------

fn module_convs(cov: &Coverage) {
    diff!(cov, [conv1d], |B, dev| {
        let x = ft::<B>(&[2, 2, 5], 1, dev);
        let w = ft::<B>(&[3, 2, 3], 2, dev);
        let b = ft::<B>(&[3], 3, dev);
        let xg = ft::<B>(&[1, 4, 6], 4, dev);
        let wg = ft::<B>(&[4, 2, 2], 5, dev);
        vec![
            read_float::<B>(B::conv1d(
                x.clone(),
                w.clone(),
                Some(b),
                ConvOptions::new([1], [1], [1], 1),
            )),
            read_float::<B>(B::conv1d(x, w, None, ConvOptions::new([2], [0], [1], 1))),
            // grouped, dilated
            read_float::<B>(B::conv1d(xg, wg, None, ConvOptions::new([1], [1], [2], 2))),
        ]
    });

    diff!(
        cov,
        [
            conv1d_x_backward,
            conv1d_weight_backward,
            conv1d_bias_backward
        ],
        |B, dev| {
            let x = ft::<B>(&[2, 2, 5], 1, dev);
            let w = ft::<B>(&[3, 2, 3], 2, dev);
            let b = ft::<B>(&[3], 3, dev);
            let g = ft::<B>(&[2, 3, 5], 4, dev);
            let o = ConvOptions::new([1], [1], [1], 1);
            vec![
                read_float::<B>(B::conv1d_x_backward(
                    x.clone(),
                    w.clone(),
                    g.clone(),
                    o.clone(),
                )),
                read_float::<B>(B::conv1d_weight_backward(x.clone(), w, g.clone(), o)),
                read_float::<B>(B::conv1d_bias_backward(x, b, g)),
            ]
        }
    );

    diff!(cov, [conv2d], |B, dev| {
        let x = ft::<B>(&[1, 2, 5, 5], 1, dev);
        let w = ft::<B>(&[3, 2, 3, 3], 2, dev);
        let b = ft::<B>(&[3], 3, dev);
        let xg = ft::<B>(&[1, 4, 4, 4], 4, dev);
        let wg = ft::<B>(&[2, 2, 3, 3], 5, dev);
        let bg = ft::<B>(&[2], 6, dev);
        vec![
            read_float::<B>(B::conv2d(
                x.clone(),
                w.clone(),
                Some(b),
                ConvOptions::new([2, 2], [1, 1], [1, 1], 1),
            )),
            read_float::<B>(B::conv2d(
                x,
                w,
                None,
                ConvOptions::new([1, 1], [0, 0], [2, 2], 1),
            )),
            read_float::<B>(B::conv2d(
                xg,
                wg,
                Some(bg),
                ConvOptions::new([1, 1], [1, 1], [1, 1], 2),
            )),
        ]
    });

    diff!(
        cov,
        [
            conv2d_x_backward,
            conv2d_weight_backward,
            conv2d_bias_backward
        ],
        |B, dev| {
            let x = ft::<B>(&[1, 2, 5, 5], 1, dev);
            let w = ft::<B>(&[3, 2, 3, 3], 2, dev);
            let b = ft::<B>(&[3], 3, dev);
            // stride 2, padding 1: output [1, 3, 3, 3]
            let g = ft::<B>(&[1, 3, 3, 3], 4, dev);
            let o = ConvOptions::new([2, 2], [1, 1], [1, 1], 1);
            vec![
                read_float::<B>(B::conv2d_x_backward(
                    x.clone(),
                    w.clone(),
                    g.clone(),
                    o.clone(),
                )),
                read_float::<B>(B::conv2d_weight_backward(x.clone(), w, g.clone(), o)),
                read_float::<B>(B::conv2d_bias_backward(x, b, g)),
            ]
        }
    );

    diff!(cov, [conv3d], |B, dev| {
        let x = ft::<B>(&[1, 2, 3, 3, 3], 1, dev);
        let w = ft::<B>(&[2, 2, 2, 2, 2], 2, dev);
        let b = ft::<B>(&[2], 3, dev);
        vec![
            read_float::<B>(B::conv3d(
                x.clone(),
                w.clone(),
                Some(b),
                ConvOptions::new([1, 1, 1], [0, 0, 0], [1, 1, 1], 1),
            )),
            read_float::<B>(B::conv3d(
                x,
                w,
                None,
                ConvOptions::new([2, 2, 2], [1, 1, 1], [1, 1, 1], 1),
            )),
        ]
    });

    diff!(
        cov,
        [
            conv3d_x_backward,
            conv3d_weight_backward,
            conv3d_bias_backward
        ],
        |B, dev| {
            let x = ft::<B>(&[1, 2, 3, 3, 3], 1, dev);
            let w = ft::<B>(&[2, 2, 2, 2, 2], 2, dev);
            let b = ft::<B>(&[2], 3, dev);
            let g = ft::<B>(&[1, 2, 2, 2, 2], 4, dev);
            let o = ConvOptions::new([1, 1, 1], [0, 0, 0], [1, 1, 1], 1);
            vec![
                read_float::<B>(B::conv3d_x_backward(
                    x.clone(),
                    w.clone(),
                    g.clone(),
                    o.clone(),
                )),
                read_float::<B>(B::conv3d_weight_backward(x.clone(), w, g.clone(), o)),
                read_float::<B>(B::conv3d_bias_backward(x, b, g)),
            ]
        }
    );

    diff!(cov, [conv_transpose1d], |B, dev| {
        let x = ft::<B>(&[1, 2, 4], 1, dev);
        let w = ft::<B>(&[2, 3, 3], 2, dev);
        let b = ft::<B>(&[3], 3, dev);
        vec![
            read_float::<B>(B::conv_transpose1d(
                x.clone(),
                w.clone(),
                Some(b),
                ConvTransposeOptions::new([2], [1], [1], [1], 1),
            )),
            read_float::<B>(B::conv_transpose1d(
                x,
                w,
                None,
                ConvTransposeOptions::new([1], [0], [0], [1], 1),
            )),
        ]
    });

    diff!(
        cov,
        [
            conv_transpose1d_x_backward,
            conv_transpose1d_weight_backward,
            conv_transpose1d_bias_backward
        ],
        |B, dev| {
            let x = ft::<B>(&[1, 2, 4], 1, dev);
            let w = ft::<B>(&[2, 3, 3], 2, dev);
            let b = ft::<B>(&[3], 3, dev);
            // (4 - 1) * 2 - 2 * 1 + (3 - 1) + 1 + 1 = 8
            let g = ft::<B>(&[1, 3, 8], 4, dev);
            let o = ConvTransposeOptions::new([2], [1], [1], [1], 1);
            vec![
                read_float::<B>(B::conv_transpose1d_x_backward(
                    w.clone(),
                    g.clone(),
                    o.clone(),
                )),
                read_float::<B>(B::conv_transpose1d_weight_backward(
                    x.clone(),
                    w,
                    g.clone(),
                    o,
                )),
                read_float::<B>(B::conv_transpose1d_bias_backward(x, b, g)),
            ]
        }
    );

    diff!(cov, [conv_transpose2d], |B, dev| {
        let x = ft::<B>(&[1, 2, 3, 3], 1, dev);
        let w = ft::<B>(&[2, 2, 3, 3], 2, dev);
        let b = ft::<B>(&[2], 3, dev);
        let xg = ft::<B>(&[1, 4, 2, 2], 4, dev);
        let wg = ft::<B>(&[4, 1, 2, 2], 5, dev);
        vec![
            read_float::<B>(B::conv_transpose2d(
                x.clone(),
                w.clone(),
                Some(b),
                ConvTransposeOptions::new([2, 2], [1, 1], [1, 1], [1, 1], 1),
            )),
            read_float::<B>(B::conv_transpose2d(
                x,
                w,
                None,
                ConvTransposeOptions::new([1, 1], [0, 0], [0, 0], [1, 1], 1),
            )),
            read_float::<B>(B::conv_transpose2d(
                xg,
                wg,
                None,
                ConvTransposeOptions::new([1, 1], [0, 0], [0, 0], [1, 1], 2),
            )),
        ]
    });

    diff!(
        cov,
        [
            conv_transpose2d_x_backward,
            conv_transpose2d_weight_backward,
            conv_transpose2d_bias_backward
        ],
        |B, dev| {
            let x = ft::<B>(&[1, 2, 3, 3], 1, dev);
            let w = ft::<B>(&[2, 2, 3, 3], 2, dev);
            let b = ft::<B>(&[2], 3, dev);
            // (3 - 1) * 2 - 2 + 2 + 1 + 1 = 6
            let g = ft::<B>(&[1, 2, 6, 6], 4, dev);
            let o = ConvTransposeOptions::new([2, 2], [1, 1], [1, 1], [1, 1], 1);
            vec![
                read_float::<B>(B::conv_transpose2d_x_backward(
                    w.clone(),
                    g.clone(),
                    o.clone(),
                )),
                read_float::<B>(B::conv_transpose2d_weight_backward(
                    x.clone(),
                    w,
                    g.clone(),
                    o,
                )),
                read_float::<B>(B::conv_transpose2d_bias_backward(x, b, g)),
            ]
        }
    );

    diff!(cov, [conv_transpose3d], |B, dev| {
        let x = ft::<B>(&[1, 2, 2, 2, 2], 1, dev);
        let w = ft::<B>(&[2, 1, 2, 2, 2], 2, dev);
        let b = ft::<B>(&[1], 3, dev);
        vec![
            read_float::<B>(B::conv_transpose3d(
                x.clone(),
                w.clone(),
                Some(b),
                ConvTransposeOptions::new([1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1], 1),
            )),
            read_float::<B>(B::conv_transpose3d(
                x,
                w,
                None,
                ConvTransposeOptions::new([2, 2, 2], [0, 0, 0], [1, 1, 1], [1, 1, 1], 1),
            )),
        ]
    });

    diff!(
        cov,
        [
            conv_transpose3d_x_backward,
            conv_transpose3d_weight_backward,
            conv_transpose3d_bias_backward
        ],
        |B, dev| {
            let x = ft::<B>(&[1, 2, 2, 2, 2], 1, dev);
            let w = ft::<B>(&[2, 1, 2, 2, 2], 2, dev);
            let b = ft::<B>(&[1], 3, dev);
            let g = ft::<B>(&[1, 1, 3, 3, 3], 4, dev);
            let o = ConvTransposeOptions::new([1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1], 1);
            vec![
                read_float::<B>(B::conv_transpose3d_x_backward(
                    w.clone(),
                    g.clone(),
                    o.clone(),
                )),
                read_float::<B>(B::conv_transpose3d_weight_backward(
                    x.clone(),
                    w,
                    g.clone(),
                    o,
                )),
                read_float::<B>(B::conv_transpose3d_bias_backward(x, b, g)),
            ]
        }
    );

    diff!(cov, [deform_conv2d], |B, dev| {
        // x [1, 2, 4, 4], kernel 2x2, stride 1, no padding: output 3x3.
        let x = ft::<B>(&[1, 2, 4, 4], 1, dev);
        let w = ft::<B>(&[3, 2, 2, 2], 2, dev);
        let offset = fv::<B>(
            vals(72, 3).into_iter().map(|v| v * 0.25).collect(),
            &[1, 8, 3, 3],
            dev,
        );
        let mask = fv::<B>(
            pos_vals(36, 4).into_iter().map(|v| v / 8.0).collect(),
            &[1, 4, 3, 3],
            dev,
        );
        let b = ft::<B>(&[3], 5, dev);
        let o = DeformConvOptions::new([1, 1], [0, 0], [1, 1], 1, 1);
        vec![
            read_float::<B>(B::deform_conv2d(
                x.clone(),
                offset.clone(),
                w.clone(),
                Some(mask),
                Some(b),
                o.clone(),
            )),
            read_float::<B>(B::deform_conv2d(x, offset, w, None, None, o)),
        ]
    });

    diff!(cov, [deform_conv2d_backward], |B, dev| {
        let x = ft::<B>(&[1, 2, 4, 4], 1, dev);
        let w = ft::<B>(&[3, 2, 2, 2], 2, dev);
        let offset = fv::<B>(
            vals(72, 3).into_iter().map(|v| v * 0.25).collect(),
            &[1, 8, 3, 3],
            dev,
        );
        let mask = fv::<B>(
            pos_vals(36, 4).into_iter().map(|v| v / 8.0).collect(),
            &[1, 4, 3, 3],
            dev,
        );
        let b = ft::<B>(&[3], 5, dev);
        let g = ft::<B>(&[1, 3, 3, 3], 6, dev);
        let o = DeformConvOptions::new([1, 1], [0, 0], [1, 1], 1, 1);
        let r = B::deform_conv2d_backward(x, offset, w, Some(mask), Some(b), g, o);
        let mut out = vec![
            read_float::<B>(r.x_grad),
            read_float::<B>(r.offset_grad),
            read_float::<B>(r.weight_grad),
            flag(r.mask_grad.is_some()),
            flag(r.bias_grad.is_some()),
        ];
        out.extend(r.mask_grad.map(read_float::<B>));
        out.extend(r.bias_grad.map(read_float::<B>));
        out
    });
}

// ---------------------------------------------------------------------------------------------
// ModuleOps: unfold, pools, interpolate
// ---------------------------------------------------------------------------------------------

fn module_pools(cov: &Coverage) {
    diff!(cov, [unfold4d], |B, dev| {
        let x = ft::<B>(&[1, 2, 4, 4], 1, dev);
        vec![
            read_float::<B>(B::unfold4d(
                x.clone(),
                [2, 2],
                UnfoldOptions::new([1, 1], [0, 0], [1, 1]),
            )),
            read_float::<B>(B::unfold4d(
                x,
                [2, 3],
                UnfoldOptions::new([2, 1], [1, 1], [1, 2]),
            )),
        ]
    });

    diff!(cov, [avg_pool1d, avg_pool1d_backward], |B, dev| {
        let x = ft::<B>(&[1, 2, 6], 1, dev);
        let g = ft::<B>(&[1, 2, 3], 2, dev);
        let g2 = ft::<B>(&[1, 2, 4], 3, dev);
        vec![
            read_float::<B>(B::avg_pool1d(x.clone(), 2, 2, 0, true, false)),
            read_float::<B>(B::avg_pool1d(x.clone(), 3, 2, 1, false, true)),
            read_float::<B>(B::avg_pool1d_backward(x.clone(), g, 2, 2, 0, true, false)),
            read_float::<B>(B::avg_pool1d_backward(x, g2, 3, 2, 1, false, true)),
        ]
    });

    diff!(cov, [avg_pool2d, avg_pool2d_backward], |B, dev| {
        let x = ft::<B>(&[1, 2, 4, 4], 1, dev);
        // k 2, s 2, p 1: (4 + 2 - 2) / 2 + 1 = 3
        let g = ft::<B>(&[1, 2, 3, 3], 2, dev);
        let g2 = ft::<B>(&[1, 2, 2, 2], 3, dev);
        vec![
            read_float::<B>(B::avg_pool2d(
                x.clone(),
                [2, 2],
                [2, 2],
                [1, 1],
                false,
                false,
            )),
            read_float::<B>(B::avg_pool2d(
                x.clone(),
                [2, 2],
                [2, 2],
                [1, 1],
                true,
                false,
            )),
            read_float::<B>(B::avg_pool2d(x.clone(), [3, 3], [2, 2], [0, 0], true, true)),
            read_float::<B>(B::avg_pool2d_backward(
                x.clone(),
                g,
                [2, 2],
                [2, 2],
                [1, 1],
                false,
                false,
            )),
            read_float::<B>(B::avg_pool2d_backward(
                x,
                g2,
                [3, 3],
                [2, 2],
                [0, 0],
                true,
                true,
            )),
        ]
    });

    diff!(
        cov,
        [adaptive_avg_pool2d, adaptive_avg_pool2d_backward],
        |B, dev| {
            let x = ft::<B>(&[1, 2, 5, 5], 1, dev);
            let g = ft::<B>(&[1, 2, 3, 2], 2, dev);
            vec![
                read_float::<B>(B::adaptive_avg_pool2d(x.clone(), [3, 2])),
                read_float::<B>(B::adaptive_avg_pool2d_backward(x, g)),
            ]
        }
    );

    diff!(
        cov,
        [adaptive_avg_pool1d, adaptive_avg_pool1d_backward],
        |B, dev| {
            let x = ft::<B>(&[1, 2, 7], 1, dev);
            let g = ft::<B>(&[1, 2, 3], 2, dev);
            vec![
                read_float::<B>(B::adaptive_avg_pool1d(x.clone(), 3)),
                read_float::<B>(B::adaptive_avg_pool1d_backward(x, g)),
            ]
        }
    );

    diff!(
        cov,
        [
            max_pool1d,
            max_pool1d_with_indices,
            max_pool1d_with_indices_backward
        ],
        |B, dev| {
            let x = ft::<B>(&[1, 2, 6], 1, dev);
            // k 3, s 2, p 1, d 1: (6 + 2 - 3) / 2 + 1 = 3
            let g = ft::<B>(&[1, 2, 3], 2, dev);
            let plain = B::max_pool1d(x.clone(), 3, 2, 1, 1, false);
            let dil = B::max_pool1d(x.clone(), 2, 1, 0, 2, true);
            let wi = B::max_pool1d_with_indices(x.clone(), 3, 2, 1, 1, false);
            let back =
                B::max_pool1d_with_indices_backward(x, 3, 2, 1, 1, false, g, wi.indices.clone());
            vec![
                read_float::<B>(plain),
                read_float::<B>(dil),
                read_float::<B>(wi.output),
                read_int::<B>(wi.indices),
                read_float::<B>(back.x_grad),
            ]
        }
    );

    diff!(
        cov,
        [
            max_pool2d,
            max_pool2d_with_indices,
            max_pool2d_with_indices_backward
        ],
        |B, dev| {
            let x = ft::<B>(&[1, 2, 5, 5], 1, dev);
            // k 2, s 2, p 0, ceil: 3x3
            let g = ft::<B>(&[1, 2, 3, 3], 2, dev);
            let plain = B::max_pool2d(x.clone(), [2, 2], [2, 2], [0, 0], [1, 1], true);
            let pad = B::max_pool2d(x.clone(), [3, 3], [1, 2], [1, 1], [1, 1], false);
            let dil = B::max_pool2d(x.clone(), [2, 2], [1, 1], [0, 0], [2, 2], false);
            let wi = B::max_pool2d_with_indices(x.clone(), [2, 2], [2, 2], [0, 0], [1, 1], true);
            let back = B::max_pool2d_with_indices_backward(
                x,
                [2, 2],
                [2, 2],
                [0, 0],
                [1, 1],
                true,
                g,
                wi.indices.clone(),
            );
            vec![
                read_float::<B>(plain),
                read_float::<B>(pad),
                read_float::<B>(dil),
                read_float::<B>(wi.output),
                read_int::<B>(wi.indices),
                read_float::<B>(back.x_grad),
            ]
        }
    );

    diff!(cov, [interpolate], |B, dev| {
        let x = ft::<B>(&[1, 2, 3, 3], 1, dev);
        let nearest = InterpolateOptions::new(InterpolateMode::Nearest).with_align_corners(false);
        let bilinear = InterpolateOptions::new(InterpolateMode::Bilinear);
        let bilinear_half =
            InterpolateOptions::new(InterpolateMode::Bilinear).with_align_corners(false);
        let bicubic = InterpolateOptions::new(InterpolateMode::Bicubic);
        vec![
            read_float::<B>(B::interpolate(x.clone(), [5, 4], nearest)),
            read_float::<B>(B::interpolate(x.clone(), [5, 4], bilinear)),
            read_float::<B>(B::interpolate(x.clone(), [2, 5], bilinear_half)),
            read_float::<B>(B::interpolate(x.clone(), [5, 5], bicubic)),
            // f16 input
            read_float::<B>(B::interpolate(
                fh::<B>(&[1, 2, 3, 3], 1, dev),
                [5, 4],
                InterpolateOptions::new(InterpolateMode::Bilinear),
            )),
        ]
    });

    diff!(cov, [interpolate_backward], |B, dev| {
        let x = ft::<B>(&[1, 2, 3, 3], 1, dev);
        let g = ft::<B>(&[1, 2, 5, 4], 2, dev);
        let nearest = InterpolateOptions::new(InterpolateMode::Nearest).with_align_corners(false);
        let bilinear = InterpolateOptions::new(InterpolateMode::Bilinear);
        let bilinear_half =
            InterpolateOptions::new(InterpolateMode::Bilinear).with_align_corners(false);
        vec![
            read_float::<B>(B::interpolate_backward(
                x.clone(),
                g.clone(),
                [5, 4],
                nearest,
            )),
            read_float::<B>(B::interpolate_backward(
                x.clone(),
                g.clone(),
                [5, 4],
                bilinear,
            )),
            read_float::<B>(B::interpolate_backward(x, g, [5, 4], bilinear_half)),
        ]
    });
}

// ---------------------------------------------------------------------------------------------
// ModuleOps: attention, norms, embedding, linear, ctc, fft
// ---------------------------------------------------------------------------------------------

fn module_misc(cov: &Coverage) {
    diff!(cov, [attention], |B, dev| {
        let q = ft::<B>(&[1, 2, 3, 4], 1, dev);
        let k = ft::<B>(&[1, 2, 3, 4], 2, dev);
        let v = ft::<B>(&[1, 2, 3, 4], 3, dev);
        // mask the strict upper triangle (true = masked): every row keeps at least one key
        let mask: Vec<bool> = (0..2)
            .flat_map(|_| (0..3).flat_map(|i| (0..3).map(move |j| j > i)))
            .collect();
        let bias = ft::<B>(&[1, 2, 3, 3], 4, dev);
        let custom = AttentionModuleOptions {
            scale: Some(0.5),
            softcap: Some(2.0),
            is_causal: true,
        };
        vec![
            read_float::<B>(B::attention(
                q.clone(),
                k.clone(),
                v.clone(),
                Some(bt::<B>(mask, &[1, 2, 3, 3], dev)),
                Some(bias),
                AttentionModuleOptions::default(),
            )),
            read_float::<B>(B::attention(
                q.clone(),
                k.clone(),
                v.clone(),
                None,
                None,
                AttentionModuleOptions::default(),
            )),
            read_float::<B>(B::attention(q, k, v, None, None, custom)),
        ]
    });

    diff!(cov, [layer_norm], |B, dev| {
        let x = ft::<B>(&[2, 3, 4], 1, dev);
        let gamma = ft::<B>(&[4], 2, dev);
        let beta = ft::<B>(&[4], 3, dev);
        vec![
            read_float::<B>(B::layer_norm(x.clone(), gamma.clone(), Some(beta), 1e-5)),
            read_float::<B>(B::layer_norm(x, gamma, None, 1e-3)),
        ]
    });

    diff!(cov, [embedding, embedding_backward], |B, dev| {
        let weights = ft::<B>(&[5, 3], 1, dev);
        let idx = vec![4, 0, 2, 2, 1, 4];
        let g = ft::<B>(&[2, 3, 3], 2, dev);
        vec![
            read_float::<B>(B::embedding(
                weights.clone(),
                it::<B>(idx.clone(), &[2, 3], dev),
            )),
            read_float::<B>(B::embedding_backward(
                weights,
                g,
                it::<B>(idx, &[2, 3], dev),
            )),
        ]
    });

    diff!(
        cov,
        [
            linear,
            linear_x_backward,
            linear_weight_backward,
            linear_bias_backward
        ],
        |B, dev| {
            let x = ft::<B>(&[3, 4], 1, dev);
            let x3 = ft::<B>(&[2, 3, 4], 5, dev);
            let w = ft::<B>(&[4, 5], 2, dev);
            let b = ft::<B>(&[5], 3, dev);
            let g = ft::<B>(&[3, 5], 4, dev);
            vec![
                read_float::<B>(B::linear(x.clone(), w.clone(), Some(b.clone()))),
                read_float::<B>(B::linear(x3, w.clone(), Some(b))),
                read_float::<B>(B::linear(x.clone(), w.clone(), None)),
                read_float::<B>(B::linear_x_backward(w, g.clone())),
                read_float::<B>(B::linear_weight_backward(x, g.clone())),
                read_float::<B>(B::linear_bias_backward(g)),
            ]
        }
    );

    diff!(cov, [ctc_loss], |B, dev| {
        let (lp, targets, il, tl) = ctc_inputs::<B>(dev);
        vec![read_float::<B>(B::ctc_loss(lp, targets, il, tl, 0))]
    });

    diff!(cov, [has_ctc_loss_backward], |B, dev| {
        vec![flag(B::has_ctc_loss_backward())]
    });

    // Flex has no native CTC backward (`has_ctc_loss_backward() == false`), so this is Burn's
    // default that panics; it must panic identically through burn-spill. Were it `true`, the
    // gradients would be compared instead.
    diff!(cov, [ctc_loss_backward], |B, dev| {
        let (lp, targets, il, tl) = ctc_inputs::<B>(dev);
        let grad_loss = fv::<B>(vec![1.0, 0.5], &[2], dev);
        vec![
            flag(B::has_ctc_loss_backward()),
            read_float::<B>(B::ctc_loss_backward(lp, targets, il, tl, grad_loss, 0)),
        ]
    });

    diff!(cov, [rfft, irfft], |B, dev| {
        let s = ft::<B>(&[2, 8], 1, dev);
        let s6 = ft::<B>(&[2, 6], 2, dev);
        let s_dim0 = ft::<B>(&[4, 3], 3, dev);
        let (re, im) = B::rfft(s, 1, None);
        let (re_n, im_n) = B::rfft(s6, 1, Some(8));
        let (re0, im0) = B::rfft(s_dim0, 0, None);
        let back = B::irfft(re.clone(), im.clone(), 1, None);
        let back_n = B::irfft(re_n.clone(), im_n.clone(), 1, Some(4));
        let back0 = B::irfft(re0.clone(), im0.clone(), 0, None);
        vec![
            read_float::<B>(re),
            read_float::<B>(im),
            read_float::<B>(re_n),
            read_float::<B>(im_n),
            read_float::<B>(re0),
            read_float::<B>(im0),
            read_float::<B>(back),
            read_float::<B>(back_n),
            read_float::<B>(back0),
        ]
    });
}

/// CTC inputs: log-probabilities `[T=5, N=2, C=4]` (a row-wise log-softmax computed here),
/// targets `[2, 2]`, input lengths `[5, 4]`, target lengths `[2, 1]`, blank 0.
fn ctc_inputs<B: Backend>(
    dev: &B::Device,
) -> (FloatTensor<B>, IntTensor<B>, IntTensor<B>, IntTensor<B>) {
    let logits = vals(40, 7);
    let mut lp = Vec::with_capacity(40);
    for row in logits.chunks(4) {
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
        lp.extend(row.iter().map(|v| v - lse));
    }
    (
        fv::<B>(lp, &[5, 2, 4], dev),
        it::<B>(vec![1, 2, 3, 0], &[2, 2], dev),
        it::<B>(vec![5, 4], &[2], dev),
        it::<B>(vec![2, 1], &[2], dev),
    )
}

// ---------------------------------------------------------------------------------------------
// ActivationOps
// ---------------------------------------------------------------------------------------------

fn activations(cov: &Coverage) {
    diff!(cov, [leaky_relu, relu, relu_backward, prelu], |B, dev| {
        let x = ft::<B>(&[2, 5], 1, dev);
        let g = ft::<B>(&[2, 5], 2, dev);
        let alpha = fpos::<B>(&[2, 5], 3, dev);
        let relu = B::relu(x.clone());
        vec![
            read_float::<B>(B::leaky_relu(x.clone(), Scalar::Float(0.125))),
            read_float::<B>(relu.clone()),
            read_float::<B>(B::relu_backward(relu, g)),
            read_float::<B>(B::prelu(x, alpha)),
        ]
    });

    diff!(cov, [gelu, gelu_backward], |B, dev| {
        let x = ft::<B>(&[2, 5], 1, dev);
        let g = ft::<B>(&[2, 5], 2, dev);
        vec![
            read_float::<B>(B::gelu(x.clone())),
            read_float::<B>(B::gelu_backward(x, g)),
        ]
    });

    diff!(cov, [sigmoid, sigmoid_backward, hard_sigmoid], |B, dev| {
        let x = ft::<B>(&[2, 5], 1, dev);
        let g = ft::<B>(&[2, 5], 2, dev);
        let s = B::sigmoid(x.clone());
        vec![
            read_float::<B>(s.clone()),
            read_float::<B>(B::sigmoid_backward(s, g)),
            read_float::<B>(B::hard_sigmoid(x, Scalar::Float(0.2), Scalar::Float(0.5))),
        ]
    });

    diff!(cov, [log_sigmoid, log_sigmoid_backward], |B, dev| {
        let x = ft::<B>(&[2, 5], 1, dev);
        let g = ft::<B>(&[2, 5], 2, dev);
        vec![
            read_float::<B>(B::log_sigmoid(x.clone())),
            read_float::<B>(B::log_sigmoid_backward(x, g)),
        ]
    });

    diff!(cov, [softmax, log_softmax, softmin], |B, dev| {
        let x = ft::<B>(&[3, 5], 1, dev);
        vec![
            read_float::<B>(B::softmax(x.clone(), 1)),
            read_float::<B>(B::softmax(x.clone(), 0)),
            read_float::<B>(B::log_softmax(x.clone(), 1)),
            read_float::<B>(B::log_softmax(x.clone(), 0)),
            read_float::<B>(B::softmin(x.clone(), 1)),
            read_float::<B>(B::softmin(x, 0)),
        ]
    });

    // Half precision: f16 for all 14, bf16 for a few.
    diff!(
        cov,
        [
            leaky_relu,
            relu,
            relu_backward,
            gelu,
            prelu,
            gelu_backward,
            sigmoid,
            sigmoid_backward,
            hard_sigmoid,
            log_sigmoid,
            softmax,
            log_softmax,
            softmin,
            log_sigmoid_backward
        ],
        |B, dev| {
            let x = fh::<B>(&[2, 5], 1, dev);
            let g = fh::<B>(&[2, 5], 2, dev);
            let alpha = B::float_from_data(fdata(pos_vals(10, 3), &[2, 5]).convert::<f16>(), dev);
            vec![
                read_float::<B>(B::leaky_relu(x.clone(), Scalar::Float(0.125))),
                read_float::<B>(B::relu(x.clone())),
                read_float::<B>(B::relu_backward(B::relu(x.clone()), g.clone())),
                read_float::<B>(B::gelu(x.clone())),
                read_float::<B>(B::prelu(x.clone(), alpha)),
                read_float::<B>(B::gelu_backward(x.clone(), g.clone())),
                read_float::<B>(B::sigmoid(x.clone())),
                read_float::<B>(B::sigmoid_backward(B::sigmoid(x.clone()), g.clone())),
                read_float::<B>(B::hard_sigmoid(
                    x.clone(),
                    Scalar::Float(0.2),
                    Scalar::Float(0.5),
                )),
                read_float::<B>(B::log_sigmoid(x.clone())),
                read_float::<B>(B::softmax(x.clone(), 1)),
                read_float::<B>(B::log_softmax(x.clone(), 1)),
                read_float::<B>(B::softmin(x.clone(), 0)),
                read_float::<B>(B::log_sigmoid_backward(x, g)),
            ]
        }
    );

    diff!(
        cov,
        [relu, gelu, sigmoid, softmax, log_softmax, log_sigmoid],
        |B, dev| {
            let x = fbf::<B>(&[2, 5], 1, dev);
            vec![
                read_float::<B>(B::relu(x.clone())),
                read_float::<B>(B::gelu(x.clone())),
                read_float::<B>(B::sigmoid(x.clone())),
                read_float::<B>(B::softmax(x.clone(), 1)),
                read_float::<B>(B::log_softmax(x.clone(), 0)),
                read_float::<B>(B::log_sigmoid(x)),
            ]
        }
    );
}

// ---------------------------------------------------------------------------------------------
// QTensorOps
// ---------------------------------------------------------------------------------------------

fn quantized(cov: &Coverage) {
    diff!(
        cov,
        [quantize_dynamic, q_into_data, dequantize],
        |B, dev| {
            let x = fv::<B>(q_input(), &[3, 4], dev);
            let q = B::quantize_dynamic(x.clone(), &default_scheme::<B>());
            let q8s = B::quantize_dynamic(
                x.clone(),
                &default_scheme::<B>().with_value(QuantValue::Q8S),
            );
            let qb = B::quantize_dynamic(x, &block_scheme());
            vec![
                read_q::<B>(q.clone()),
                read_float::<B>(B::dequantize(q.clone(), FloatDType::F32)),
                read_float::<B>(B::dequantize(q.clone(), FloatDType::F16)),
                read_float::<B>(B::dequantize(q.clone(), FloatDType::BF16)),
                read_float::<B>(B::dequantize(q, FloatDType::F64)),
                read_q::<B>(q8s.clone()),
                read_float::<B>(B::dequantize(q8s, FloatDType::F32)),
                read_q::<B>(qb.clone()),
                read_float::<B>(B::dequantize(qb, FloatDType::F32)),
            ]
        }
    );

    diff!(cov, [quantize], |B, dev| {
        let x = fv::<B>(q_input(), &[3, 4], dev);
        let scheme = QuantScheme::default()
            .with_value(QuantValue::Q8S)
            .with_store(QuantStore::Native);
        let per_tensor = QuantizationParametersPrimitive {
            scales: fv::<B>(vec![0.025], &[1], dev),
        };
        let q = B::quantize(x.clone(), &scheme, per_tensor);
        let per_block = QuantizationParametersPrimitive {
            scales: fv::<B>(vec![0.02, 0.03, 0.0125], &[3], dev),
        };
        let qb = B::quantize(x, &block_scheme(), per_block);
        vec![
            read_q::<B>(q.clone()),
            read_float::<B>(B::dequantize(q, FloatDType::F32)),
            read_q::<B>(qb.clone()),
            read_float::<B>(B::dequantize(qb, FloatDType::F32)),
        ]
    });

    diff!(cov, [q_from_data], |B, dev| {
        let scheme = QuantScheme::default()
            .with_value(QuantValue::Q8S)
            .with_store(QuantStore::Native);
        let data =
            TensorData::quantized(vec![-100i8, -50, 0, 25, 60, 127], [2, 3], scheme, &[0.02]);
        let q = B::q_from_data(data, dev);
        // round trip of what a quantized read returns
        let again = B::q_from_data(read_q::<B>(qt::<B>(dev)), dev);
        let block = B::q_from_data(
            read_q::<B>(B::quantize_dynamic(
                fv::<B>(q_input(), &[3, 4], dev),
                &block_scheme(),
            )),
            dev,
        );
        vec![
            read_q::<B>(q.clone()),
            read_float::<B>(B::dequantize(q, FloatDType::F32)),
            read_q::<B>(again),
            read_q::<B>(block),
        ]
    });

    diff!(cov, [q_device, q_to_device], |B, dev| {
        let q = qt::<B>(dev);
        let d = B::q_device(&q);
        vec![
            text(&format!("{d:?}")),
            flag(&d == dev),
            read_q::<B>(B::q_to_device(q, dev)),
        ]
    });

    diff!(
        cov,
        [q_reshape, q_detach, q_set_require_grad, q_is_require_grad],
        |B, dev| {
            let q = qt::<B>(dev);
            let r = B::q_reshape(q.clone(), Shape::new([2, 6]));
            let d = B::q_detach(q.clone());
            let g = B::q_set_require_grad(q.clone(), true);
            vec![
                read_q::<B>(r),
                read_q::<B>(d),
                flag(B::q_is_require_grad(&q)),
                flag(B::q_is_require_grad(&g)),
                read_q::<B>(g),
                // block quantized reshape dequantizes and requantizes
                read_q::<B>(B::q_reshape(
                    B::quantize_dynamic(fv::<B>(q_input(), &[3, 4], dev), &block_scheme()),
                    Shape::new([4, 3]),
                )),
            ]
        }
    );

    diff!(
        cov,
        [q_expand, q_transpose, q_swap_dims, q_permute, q_flip],
        |B, dev| {
            let q = qt::<B>(dev);
            let row = B::quantize_dynamic(ft::<B>(&[1, 4], 1, dev), &default_scheme::<B>());
            let q3 = B::q_reshape(q.clone(), Shape::new([3, 2, 2]));
            let qb = B::quantize_dynamic(fv::<B>(q_input(), &[3, 4], dev), &block_scheme());
            vec![
                read_q::<B>(B::q_expand(row, Shape::new([3, 4]))),
                read_q::<B>(B::q_transpose(q.clone())),
                read_q::<B>(B::q_swap_dims(q3.clone(), 0, 2)),
                read_q::<B>(B::q_permute(q3, &[1, 2, 0])),
                read_q::<B>(B::q_flip(q.clone(), &[0, 1])),
                read_q::<B>(B::q_flip(q, &[1])),
                read_q::<B>(B::q_transpose(qb.clone())),
                read_q::<B>(B::q_flip(qb, &[0])),
            ]
        }
    );

    diff!(
        cov,
        [q_select, q_slice, q_gather, q_repeat_dim],
        |B, dev| {
            let q = qt::<B>(dev);
            let qb = B::quantize_dynamic(fv::<B>(q_input(), &[3, 4], dev), &block_scheme());
            vec![
                read_q::<B>(B::q_select(q.clone(), 1, it::<B>(vec![3, 0, 2], &[3], dev))),
                read_q::<B>(B::q_select(qb.clone(), 0, it::<B>(vec![2, 0], &[2], dev))),
                read_q::<B>(B::q_slice(
                    q.clone(),
                    &[Slice::new(1, Some(3), 1), Slice::new(0, None, 2)],
                )),
                read_q::<B>(B::q_gather(
                    1,
                    q.clone(),
                    it::<B>(vec![0, 3, 1, 1, 2, 2], &[3, 2], dev),
                )),
                read_q::<B>(B::q_gather(0, qb, it::<B>(vec![2, 1, 0, 0], &[1, 4], dev))),
                read_q::<B>(B::q_repeat_dim(q, 0, 2)),
            ]
        }
    );

    diff!(
        cov,
        [
            q_add,
            q_add_scalar,
            q_sub,
            q_sub_scalar,
            q_mul,
            q_mul_scalar,
            q_div,
            q_div_scalar
        ],
        |B, dev| {
            let a = qt::<B>(dev);
            let b = qpos::<B>(2, dev);
            vec![
                read_prim::<B>(B::q_add(a.clone(), b.clone())),
                read_prim::<B>(B::q_add_scalar(a.clone(), Scalar::Float(1.5))),
                read_prim::<B>(B::q_sub(a.clone(), b.clone())),
                read_prim::<B>(B::q_sub_scalar(a.clone(), Scalar::Float(0.75))),
                read_prim::<B>(B::q_mul(a.clone(), b.clone())),
                read_prim::<B>(B::q_mul_scalar(a.clone(), Scalar::Float(-2.0))),
                read_prim::<B>(B::q_div(a.clone(), b)),
                read_prim::<B>(B::q_div_scalar(a, Scalar::Float(3.0))),
            ]
        }
    );

    diff!(cov, [q_clamp_min, q_clamp_max, q_clamp], |B, dev| {
        let a = qt::<B>(dev);
        vec![
            read_prim::<B>(B::q_clamp_min(a.clone(), Scalar::Float(-1.0))),
            read_prim::<B>(B::q_clamp_max(a.clone(), Scalar::Float(1.0))),
            read_prim::<B>(B::q_clamp(a, Scalar::Float(-0.5), Scalar::Float(2.0))),
        ]
    });

    diff!(cov, [q_matmul], |B, dev| {
        let a = qt::<B>(dev);
        let b = B::quantize_dynamic(ft::<B>(&[4, 2], 3, dev), &default_scheme::<B>());
        let bf = ft::<B>(&[4, 2], 4, dev);
        let af = ft::<B>(&[3, 4], 5, dev);
        vec![
            read_prim::<B>(B::q_matmul(
                TensorPrimitive::QFloat(a.clone()),
                TensorPrimitive::QFloat(b.clone()),
            )),
            read_prim::<B>(B::q_matmul(
                TensorPrimitive::QFloat(a),
                TensorPrimitive::Float(bf),
            )),
            read_prim::<B>(B::q_matmul(
                TensorPrimitive::Float(af),
                TensorPrimitive::QFloat(b),
            )),
        ]
    });

    diff!(
        cov,
        [
            q_neg, q_recip, q_sum, q_sum_dim, q_prod, q_prod_dim, q_mean, q_mean_dim
        ],
        |B, dev| {
            let a = qt::<B>(dev);
            let p = qpos::<B>(3, dev);
            vec![
                read_prim::<B>(B::q_neg(a.clone())),
                read_prim::<B>(B::q_recip(p.clone())),
                read_prim::<B>(B::q_sum(a.clone())),
                read_prim::<B>(B::q_sum_dim(a.clone(), 1)),
                read_prim::<B>(B::q_prod(p.clone())),
                read_prim::<B>(B::q_prod_dim(a.clone(), 0)),
                read_prim::<B>(B::q_mean(a.clone())),
                read_prim::<B>(B::q_mean_dim(a, 0)),
            ]
        }
    );

    diff!(cov, [q_cumsum, q_cumprod, q_cummin, q_cummax], |B, dev| {
        let a = qt::<B>(dev);
        vec![
            read_prim::<B>(B::q_cumsum(a.clone(), 1)),
            read_prim::<B>(B::q_cumprod(a.clone(), 0)),
            read_prim::<B>(B::q_cummin(a.clone(), 1)),
            read_prim::<B>(B::q_cummax(a, 0)),
        ]
    });

    diff!(
        cov,
        [
            q_exp,
            q_log,
            q_log1p,
            q_powf,
            q_powi,
            q_powi_scalar,
            q_powf_scalar,
            q_sqrt,
            q_abs
        ],
        |B, dev| {
            let a = qt::<B>(dev);
            let p = qpos::<B>(4, dev);
            let e = qpos::<B>(5, dev);
            vec![
                read_prim::<B>(B::q_exp(a.clone())),
                read_prim::<B>(B::q_log(p.clone())),
                read_prim::<B>(B::q_log1p(p.clone())),
                read_prim::<B>(B::q_powf(p.clone(), e)),
                read_prim::<B>(B::q_powi(
                    a.clone(),
                    it::<B>(vec![0, 1, 2, 3, 1, 2, 3, 0, 2, 2, 1, 3], &[3, 4], dev),
                )),
                read_prim::<B>(B::q_powi_scalar(a.clone(), Scalar::Int(3))),
                read_prim::<B>(B::q_powf_scalar(p.clone(), Scalar::Float(0.5))),
                read_prim::<B>(B::q_sqrt(p)),
                read_q::<B>(B::q_abs(a)),
            ]
        }
    );

    diff!(
        cov,
        [q_cos, q_sin, q_tan, q_cosh, q_sinh, q_tanh, q_erf],
        |B, dev| {
            let a = qt::<B>(dev);
            vec![
                read_prim::<B>(B::q_cos(a.clone())),
                read_prim::<B>(B::q_sin(a.clone())),
                read_prim::<B>(B::q_tan(a.clone())),
                read_prim::<B>(B::q_cosh(a.clone())),
                read_prim::<B>(B::q_sinh(a.clone())),
                read_prim::<B>(B::q_tanh(a.clone())),
                read_prim::<B>(B::q_erf(a)),
            ]
        }
    );

    diff!(cov, [q_cat], |B, dev| {
        let a = qt::<B>(dev);
        let b = qpos::<B>(6, dev);
        vec![
            read_q::<B>(B::q_cat(vec![a.clone(), b.clone()], 0)),
            read_q::<B>(B::q_cat(vec![a, b], 1)),
        ]
    });

    diff!(
        cov,
        [
            q_argmax,
            q_topk,
            q_argmin,
            q_max,
            q_max_dim,
            q_max_dim_with_indices,
            q_min,
            q_min_dim,
            q_min_dim_with_indices,
            q_max_abs,
            q_max_abs_dim
        ],
        |B, dev| {
            let a = qt::<B>(dev);
            let (mx, mxi) = B::q_max_dim_with_indices(a.clone(), 1, IntDType::I32);
            let (mn, mni) = B::q_min_dim_with_indices(a.clone(), 0, IntDType::I64);
            vec![
                read_int::<B>(B::q_argmax(a.clone(), 1, IntDType::I32)),
                read_int::<B>(B::q_argmax(a.clone(), 0, IntDType::I64)),
                read_q::<B>(B::q_topk(a.clone(), 1, 2)),
                read_int::<B>(B::q_argmin(a.clone(), 1, IntDType::I32)),
                read_q::<B>(B::q_max(a.clone())),
                read_q::<B>(B::q_max_dim(a.clone(), 0)),
                read_q::<B>(mx),
                read_int::<B>(mxi),
                read_q::<B>(B::q_min(a.clone())),
                read_q::<B>(B::q_min_dim(a.clone(), 1)),
                read_q::<B>(mn),
                read_int::<B>(mni),
                read_q::<B>(B::q_max_abs(a.clone())),
                read_q::<B>(B::q_max_abs_dim(a, 1)),
            ]
        }
    );

    // Flex 0.21 leaves `float_argtopk` unimplemented (`unimplemented!`), which Burn's default
    // `q_argtopk` calls: both sides must panic with the same message.
    diff!(cov, [q_argtopk], |B, dev| {
        vec![read_int::<B>(B::q_argtopk(
            qt::<B>(dev),
            1,
            2,
            IntDType::I32,
        ))]
    });

    diff!(cov, [q_any, q_any_dim, q_all, q_all_dim], |B, dev| {
        // a zero in row 1 so any/all differ by row
        let z = B::quantize_dynamic(
            fv::<B>(
                vec![0.5, -1.0, 2.0, 0.0, 0.0, 0.0, 1.0, -2.0, 0.0],
                &[3, 3],
                dev,
            ),
            &default_scheme::<B>(),
        );
        vec![
            read_bool::<B>(B::q_any(z.clone(), BoolDType::Native)),
            read_bool::<B>(B::q_any_dim(z.clone(), 1, BoolDType::Native)),
            read_bool::<B>(B::q_all(z.clone(), BoolDType::Native)),
            read_bool::<B>(B::q_all_dim(z.clone(), 0, BoolDType::Native)),
            read_bool::<B>(B::q_any_dim(z.clone(), 0, BoolStore::U8)),
            read_bool::<B>(B::q_all(qpos::<B>(1, dev), BoolDType::Native)),
        ]
    });

    diff!(cov, [q_sort, q_sort_with_indices, q_argsort], |B, dev| {
        let a = qt::<B>(dev);
        let (s, si) = B::q_sort_with_indices(a.clone(), 1, true, IntDType::I32);
        vec![
            read_q::<B>(B::q_sort(a.clone(), 1, false)),
            read_q::<B>(B::q_sort(a.clone(), 0, true)),
            read_q::<B>(s),
            read_int::<B>(si),
            read_int::<B>(B::q_argsort(a.clone(), 1, false, IntDType::I32)),
            read_int::<B>(B::q_argsort(a, 0, true, IntDType::I64)),
        ]
    });
}

// ---------------------------------------------------------------------------------------------
// TransactionOps
// ---------------------------------------------------------------------------------------------

fn transaction(cov: &Coverage) {
    diff!(cov, [tr_execute], |B, dev| {
        let tr = TransactionPrimitive::<B>::new(
            vec![ft::<B>(&[2, 3], 1, dev), fh::<B>(&[3], 2, dev)],
            vec![qt::<B>(dev)],
            vec![
                it::<B>(vec![3, -1, 4], &[3], dev),
                it::<B>(vec![7], &[1], dev),
            ],
            vec![bt::<B>(vec![true, false, false, true], &[2, 2], dev)],
        );
        let data = burn::tensor::read_sync(B::tr_execute(tr)).expect("transaction");
        let counts = TensorData::from([
            data.read_floats.len() as i32,
            data.read_qfloats.len() as i32,
            data.read_ints.len() as i32,
            data.read_bools.len() as i32,
        ]);
        let mut out = vec![counts];
        out.extend(data.read_floats);
        out.extend(data.read_qfloats);
        out.extend(data.read_ints);
        out.extend(data.read_bools);
        // an empty transaction and one with only ints
        let empty = burn::tensor::read_sync(B::tr_execute(TransactionPrimitive::<B>::new(
            vec![],
            vec![],
            vec![],
            vec![],
        )))
        .expect("empty transaction");
        out.push(TensorData::from([
            empty.read_floats.len() as i32,
            empty.read_qfloats.len() as i32,
            empty.read_ints.len() as i32,
            empty.read_bools.len() as i32,
        ]));
        let ints = burn::tensor::read_sync(B::tr_execute(TransactionPrimitive::<B>::new(
            vec![],
            vec![],
            vec![it::<B>(vec![9, 8], &[2], dev)],
            vec![],
        )))
        .expect("int transaction");
        out.extend(ints.read_ints);
        out
    });
}

// ---------------------------------------------------------------------------------------------
// Backend
// ---------------------------------------------------------------------------------------------

fn all_dtypes<B: Backend>() -> Vec<DType> {
    vec![
        DType::F64,
        DType::F32,
        DType::Flex32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
        DType::Bool(BoolStore::Native),
        DType::Bool(BoolStore::U8),
        DType::Bool(BoolStore::U32),
        DType::QFloat(default_scheme::<B>()),
        DType::QFloat(QuantScheme::default()),
        DType::QFloat(block_scheme()),
    ]
}

fn backend_methods(cov: &Coverage) {
    diff!(cov, [ad_enabled, device_count, sync], |B, dev| {
        vec![
            flag(B::ad_enabled(dev)),
            TensorData::from([B::device_count(0) as i64, B::device_count(1) as i64]),
            flag(B::sync(dev).is_ok()),
        ]
    });

    diff!(cov, [memory_cleanup], |B, dev| {
        let x = ft::<B>(&[2, 3], 1, dev);
        let y = B::float_add_scalar(x.clone(), Scalar::Float(1.0));
        B::memory_cleanup(dev);
        // tensors alive across a cleanup keep their data
        vec![read_float::<B>(x), read_float::<B>(y)]
    });

    diff!(cov, [seed], |B, dev| {
        B::seed(dev, 42);
        let a = B::float_random(
            Shape::new([2, 3]),
            Distribution::Uniform(-1.0, 1.0),
            dev,
            FloatDType::F32,
        );
        let b = B::float_random(Shape::new([4]), Distribution::Default, dev, FloatDType::F32);
        B::seed(dev, 42);
        let c = B::float_random(
            Shape::new([2, 3]),
            Distribution::Uniform(-1.0, 1.0),
            dev,
            FloatDType::F32,
        );
        vec![read_float::<B>(a), read_float::<B>(b), read_float::<B>(c)]
    });

    diff!(cov, [staging], |B, dev| {
        let mut data = vec![fdata(vals(6, 1), &[2, 3]), TensorData::from([1i32, 2, 3])];
        B::staging(data.iter_mut(), dev);
        // staged data is still valid input
        let f = B::float_from_data(data[0].clone(), dev);
        data.push(read_float::<B>(f));
        data
    });

    diff!(cov, [supports_dtype, dtype_usage], |B, dev| {
        let dtypes = all_dtypes::<B>();
        let supports: Vec<u8> = dtypes
            .iter()
            .map(|d| B::supports_dtype(dev, *d) as u8)
            .collect();
        let usage: Vec<String> = dtypes
            .iter()
            .map(|d| format!("{d:?}: {:?}", B::dtype_usage(dev, *d)))
            .collect();
        vec![
            TensorData::new(supports, [dtypes.len()]),
            text(&usage.join("\n")),
        ]
    });

    diff!(cov, [memory_persistent_allocations], |B, dev| {
        let t = B::memory_persistent_allocations(
            dev,
            (fdata(vals(6, 2), &[3, 2]), dev.clone()),
            |(d, dv)| B::float_from_data(d, &dv),
        );
        // nested scopes and ops inside the scope
        let (u, n) = B::memory_persistent_allocations(dev, dev.clone(), |dv| {
            let inner =
                B::memory_persistent_allocations(&dv, dv.clone(), |dv2| ft::<B>(&[4], 3, &dv2));
            (B::float_mul_scalar(inner, Scalar::Float(2.0)), 7i32)
        });
        vec![
            read_float::<B>(t),
            read_float::<B>(u),
            TensorData::from([n]),
        ]
    });

    // `name` differs on purpose: burn-spill wraps the inner name.
    diff!(cov, [name], |B, dev| {
        let n = B::name(dev);
        let inner = n
            .strip_prefix("spill<")
            .and_then(|s| s.strip_suffix('>'))
            .unwrap_or(&n)
            .to_string();
        vec![text(&inner)]
    });
    let dev = Default::default();
    assert_eq!(Spill::name(&dev), format!("spill<{}>", Plain::name(&dev)));
    assert_eq!(Plain::name(&dev), "flex");

    // Roles: created inside `memory_persistent_allocations` => Parameter, outside => Other.
    let outside = Spill::float_from_data(TensorData::from([1.0f32, 2.0]), &dev);
    assert_eq!(outside.role(), TensorRole::Other);
    let inside = Spill::memory_persistent_allocations(&dev, TensorData::from([3.0f32, 4.0]), |d| {
        Spill::float_from_data(d, &Default::default())
    });
    assert_eq!(inside.role(), TensorRole::Parameter);
    let nested = Spill::memory_persistent_allocations(&dev, (), |()| {
        Spill::memory_persistent_allocations(&Default::default(), (), |()| {
            Spill::float_from_data(TensorData::from([5.0f32]), &Default::default())
        })
    });
    assert_eq!(nested.role(), TensorRole::Parameter);
    // the scope ends with the closure, also after a nested one
    let after = Spill::float_from_data(TensorData::from([6.0f32]), &dev);
    assert_eq!(after.role(), TensorRole::Other);
    let derived = Spill::float_add(inside.clone(), outside.clone());
    assert_eq!(derived.role(), TensorRole::Other);
    assert_same_data(
        &read_float::<Plain>(Plain::float_from_data(
            TensorData::from([3.0f32, 4.0]),
            &dev,
        )),
        &read_float::<Spill>(inside),
        "parameter created inside memory_persistent_allocations",
    );
}
