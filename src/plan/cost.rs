//! What one recorded op costs on a device: FLOPs and bytes from its name, shapes and dtypes,
//! and from those its device time on a [`DeviceProfile`].
//!
//! On a CubeCL backend ops are asynchronous, so the durations a tape records are dispatch
//! times, not kernel times; a target GPU's times must come from the op itself. The model is a
//! roofline: an op takes its launch cost plus the longer of its arithmetic at the profile's
//! (derated) peak and its bytes at the (derated) memory bandwidth.
//!
//! - Matrix ops (matmul, linear, convolutions and their backward ops, attention) count
//!   `2 * multiply-adds` at the matrix rate of their dtype.
//! - View ops (reshape, swap_dims, permute, expand, device queries, `empty`) launch no kernel
//!   on CubeCL and cost nothing.
//! - Reads to and writes from the host (`*_into_data`, `*_from_data`) cross the host link.
//! - Every other op, named or not (elementwise, reductions, gathers, pools, norms, casts,
//!   creation, random): memory-bound, reading each distinct input once and writing each output
//!   once, one FLOP per output element. This fallback is what an op missing from the list
//!   above gets; it understates ops with heavy arithmetic per byte (a deformable convolution's
//!   sampling, an FFT).

use crate::engine::TensorId;
use crate::tape::{OpRecord, StepTape, TensorRecord};

use super::profile::{DeviceProfile, OpTimes};

/// What kind of work an op is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpClass {
    /// Matmul, linear, convolution, attention: tensor-core work.
    Matrix,
    /// Bytes bound: elementwise, reductions, everything not named otherwise.
    Memory,
    /// No kernel: a change of shape or strides, a metadata query.
    View,
    /// A read of device bytes to the host.
    ToHost,
    /// A write of host bytes to the device.
    FromHost,
}

/// FLOPs and bytes of one op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpCost {
    /// The kind of work.
    pub class: OpClass,
    /// FLOPs at the matrix rate.
    pub matrix_flops: f64,
    /// FLOPs at the plain vector rate.
    pub vector_flops: f64,
    /// Device-memory bytes read and written (for host transfers: bytes crossing the link).
    pub bytes: u64,
    /// The dtype the matrix rate is looked up for.
    pub dtype: MatrixDtype,
}

/// The dtypes the matrix rate distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixDtype {
    /// `F32` (and anything else that is not half precision).
    F32,
    /// `F16`.
    F16,
    /// `BF16`.
    Bf16,
}

impl MatrixDtype {
    /// The matrix dtype of a dtype as Burn prints it (`F16`, `BF16`; anything else is `F32`).
    pub fn of(dtype: &str) -> Self {
        match dtype.to_ascii_uppercase().as_str() {
            "F16" => MatrixDtype::F16,
            "BF16" => MatrixDtype::Bf16,
            _ => MatrixDtype::F32,
        }
    }
}

/// What the model reads of one tensor: a tape's record, or a live tensor's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorView<'a> {
    /// Its id (an input read twice is counted once).
    pub id: TensorId,
    /// Its bytes.
    pub bytes: u64,
    /// Its dtype, as far as the matrix rate cares.
    pub dtype: MatrixDtype,
    /// Its shape.
    pub shape: &'a [usize],
}

impl<'a> From<&'a TensorRecord> for TensorView<'a> {
    fn from(t: &'a TensorRecord) -> Self {
        Self {
            id: t.id,
            bytes: t.bytes,
            dtype: MatrixDtype::of(&t.dtype),
            shape: &t.shape,
        }
    }
}

fn elements(t: &TensorView) -> f64 {
    t.shape.iter().map(|&d| d as f64).product()
}

/// The product of a weight's dimensions after the first: the multiply-adds per output element
/// of a convolution (`[out, in / groups, k...]`: groups, stride and padding are in the shapes).
fn per_output(weight: &TensorView) -> f64 {
    weight.shape.iter().skip(1).map(|&d| d as f64).product()
}

fn last_dim(t: &TensorView) -> f64 {
    t.shape.last().copied().unwrap_or(1) as f64
}

/// An op's name without its tensor-kind prefix: `float_matmul` -> `matmul`.
fn base_name(name: &str) -> &str {
    for prefix in ["float_", "int_", "bool_", "q_"] {
        if let Some(rest) = name.strip_prefix(prefix) {
            return rest;
        }
    }
    name
}

/// Matrix multiply-adds x 2 of a matrix op, from its input and output records, or `None` when
/// the op is not one (or its records are missing).
fn matrix_flops(name: &str, inputs: &[TensorView], outputs: &[TensorView]) -> Option<f64> {
    let input = |i: usize| inputs.get(i);
    let output = outputs.first();
    let flops = match name {
        // [.., m, k] x [.., k, n] -> [.., m, n]
        "matmul" | "linear" => 2.0 * elements(output?) * last_dim(input(0)?),
        // (weight [in, out], grad [.., out]) -> [.., in]
        "linear_x_backward" => 2.0 * elements(output?) * last_dim(input(1)?),
        // (x [.., in], grad [.., out]) -> [in, out]
        "linear_weight_backward" => 2.0 * elements(input(0)?) * last_dim(input(1)?),
        // (x, weight [out, in/g, k..], bias?) -> [n, out, spatial..]
        "conv1d" | "conv2d" | "conv3d" => 2.0 * elements(output?) * per_output(input(1)?),
        // (x, weight, grad): as many multiply-adds as the forward op, whose output is `grad`.
        "conv1d_x_backward"
        | "conv2d_x_backward"
        | "conv3d_x_backward"
        | "conv1d_weight_backward"
        | "conv2d_weight_backward"
        | "conv3d_weight_backward" => 2.0 * elements(input(2)?) * per_output(input(1)?),
        // (x, offset, weight, mask?, bias?): the convolution's share; sampling is extra.
        "deform_conv2d" => 2.0 * elements(output?) * per_output(input(2)?),
        // (x [n, in, ..], weight [in, out/g, k..], bias?): each input element feeds
        // out/g * k.. outputs.
        "conv_transpose1d" | "conv_transpose2d" | "conv_transpose3d" => {
            2.0 * elements(input(0)?) * per_output(input(1)?)
        }
        // (weight, grad) -> dx, shaped like x.
        "conv_transpose1d_x_backward"
        | "conv_transpose2d_x_backward"
        | "conv_transpose3d_x_backward" => 2.0 * elements(output?) * per_output(input(0)?),
        // (x, weight, grad)
        "conv_transpose1d_weight_backward"
        | "conv_transpose2d_weight_backward"
        | "conv_transpose3d_weight_backward" => 2.0 * elements(input(0)?) * per_output(input(1)?),
        // q [b, h, lq, d], k [b, h, lk, d], v [b, h, lk, dv]: q k^T, then the weights times v.
        "attention" => {
            let (q, k, v) = (input(0)?, input(1)?, input(2)?);
            let lk = *k.shape.get(k.shape.len().checked_sub(2)?)? as f64;
            2.0 * elements(q) * lk + 2.0 * (elements(q) / last_dim(q)) * lk * last_dim(v)
        }
        _ => return None,
    };
    Some(flops)
}

fn is_view(name: &str) -> bool {
    matches!(
        name,
        "reshape" | "swap_dims" | "permute" | "expand" | "device" | "empty" | "transpose"
    )
}

/// The cost of `op`, whose tensors `lookup` finds (an unknown id counts as 0 bytes).
pub fn op_cost<'t>(op: &OpRecord, lookup: impl Fn(TensorId) -> Option<&'t TensorRecord>) -> OpCost {
    let view = |id: &TensorId| lookup(*id).map(TensorView::from);
    let inputs: Vec<TensorView> = op.inputs.iter().filter_map(view).collect();
    let outputs: Vec<TensorView> = op.outputs.iter().filter_map(view).collect();
    cost_of(&op.name, &inputs, &outputs)
}

/// The cost of the op named `name` (as Burn's ops traits name it) reading `inputs` (in
/// argument order; one read twice counts once) and writing `outputs`.
pub fn cost_of(name: &str, inputs: &[TensorView], outputs: &[TensorView]) -> OpCost {
    let input_bytes: u64 = inputs
        .iter()
        .enumerate()
        .filter(|(k, t)| !inputs[..*k].iter().any(|seen| seen.id == t.id))
        .map(|(_, t)| t.bytes)
        .sum();
    let output_bytes: u64 = outputs.iter().map(|t| t.bytes).sum();
    let output_elements: f64 = outputs.iter().map(elements).sum();
    let dtype = inputs
        .first()
        .or(outputs.first())
        .map_or(MatrixDtype::F32, |t| t.dtype);
    let base = base_name(name);
    let (class, bytes, matrix, vector) = if name.ends_with("_into_data") {
        (OpClass::ToHost, input_bytes, 0.0, 0.0)
    } else if name.ends_with("_from_data") {
        (OpClass::FromHost, output_bytes, 0.0, 0.0)
    } else if is_view(base) {
        (OpClass::View, 0, 0.0, 0.0)
    } else if let Some(flops) = matrix_flops(base, inputs, outputs) {
        (OpClass::Matrix, input_bytes + output_bytes, flops, 0.0)
    } else {
        (
            OpClass::Memory,
            input_bytes + output_bytes,
            0.0,
            output_elements,
        )
    };
    OpCost {
        class,
        matrix_flops: matrix,
        vector_flops: vector,
        bytes,
        dtype,
    }
}

/// The cost of an elementwise op, as [`cost_of`] gives it, from its inputs' bytes (each input
/// once) and its output's bytes and elements: what a recipe prices its op with once the
/// tensors' shapes are gone (every op that keeps a recipe is elementwise).
pub fn elementwise(
    input_bytes: u64,
    output_bytes: u64,
    output_elements: u64,
    dtype: MatrixDtype,
) -> OpCost {
    OpCost {
        class: OpClass::Memory,
        matrix_flops: 0.0,
        vector_flops: output_elements as f64,
        bytes: input_bytes + output_bytes,
        dtype,
    }
}

/// Seconds `cost` keeps the device's compute stream busy on `profile` (a host transfer keeps
/// it waiting for the link).
pub fn device_seconds(cost: &OpCost, profile: &DeviceProfile) -> f64 {
    match cost.class {
        OpClass::ToHost => profile.link_seconds(cost.bytes, false, false),
        OpClass::FromHost => profile.link_seconds(cost.bytes, true, false),
        OpClass::View | OpClass::Memory | OpClass::Matrix => KernelModel::of(profile).seconds(cost),
    }
}

/// The figures of a profile that time a kernel, derated by its efficiencies: what the engine
/// keeps (it is `Copy`) to time a rebuild on the device it runs on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelModel {
    launch_seconds: f64,
    memory_bytes_per_second: f64,
    vector_flops_per_second: f64,
    /// `F32` (TF32 where the profile runs `F32` matrix ops on it), `F16`, `BF16`.
    matrix_flops_per_second: [f64; 3],
}

impl KernelModel {
    /// `profile`'s kernel figures.
    pub fn of(profile: &DeviceProfile) -> Self {
        let rate = |tflops: f64| tflops * 1e12 * profile.compute_efficiency;
        let m = &profile.matrix_tflops;
        let f32_matrix = if profile.f32_matmul_tf32 {
            m.tf32
        } else {
            m.f32
        };
        Self {
            launch_seconds: profile.launch_us * 1e-6,
            memory_bytes_per_second: profile.hbm_gb_per_s * 1e9 * profile.memory_efficiency,
            vector_flops_per_second: rate(profile.vector_tflops_f32),
            matrix_flops_per_second: [rate(f32_matrix), rate(m.f16), rate(m.bf16)],
        }
    }

    /// Seconds the kernel of `cost` takes: its launch plus the longer of its bytes and its
    /// arithmetic (a view launches nothing; a host transfer counts as one pass over its bytes,
    /// the link being the profile's to time).
    pub fn seconds(&self, cost: &OpCost) -> f64 {
        let memory = cost.bytes as f64 / self.memory_bytes_per_second;
        let arithmetic = match cost.class {
            OpClass::View => return 0.0,
            OpClass::ToHost | OpClass::FromHost => 0.0,
            OpClass::Memory => cost.vector_flops / self.vector_flops_per_second,
            OpClass::Matrix => {
                let peak = match cost.dtype {
                    MatrixDtype::F32 => self.matrix_flops_per_second[0],
                    MatrixDtype::F16 => self.matrix_flops_per_second[1],
                    MatrixDtype::Bf16 => self.matrix_flops_per_second[2],
                };
                cost.matrix_flops / peak
            }
        };
        self.launch_seconds + memory.max(arithmetic)
    }
}

/// Each op's device time on `profile`, in seconds, in tape order: modelled from the op, or
/// the recorded duration for a [`OpTimes::Recorded`] profile.
pub fn op_seconds(tape: &StepTape, profile: &DeviceProfile) -> Vec<f64> {
    if profile.op_times == OpTimes::Recorded {
        return tape
            .ops
            .iter()
            .map(|op| op.duration_ns as f64 * 1e-9)
            .collect();
    }
    let by_id: std::collections::HashMap<TensorId, &TensorRecord> =
        tape.tensors.iter().map(|t| (t.id, t)).collect();
    tape.ops
        .iter()
        .map(|op| device_seconds(&op_cost(op, |id| by_id.get(&id).copied()), profile))
        .collect()
}

/// Host time before each op that no op accounts for (autodiff's own work, the training loop),
/// in seconds, in tape order, and after the last op. On a synchronous backend
/// ([`OpTimes::Recorded`]) the device waits for it; on a GPU the host dispatches ahead of the
/// device and the modelled profiles take it as hidden (all zeros).
pub fn host_gaps(tape: &StepTape, profile: &DeviceProfile) -> (Vec<f64>, f64) {
    if profile.op_times != OpTimes::Recorded {
        return (vec![0.0; tape.ops.len()], 0.0);
    }
    let mut end = 0u64;
    let gaps = tape
        .ops
        .iter()
        .map(|op| {
            let gap = op.start_ns.saturating_sub(end);
            end = end.max(op.start_ns + op.duration_ns);
            gap as f64 * 1e-9
        })
        .collect();
    (gaps, tape.duration_ns.saturating_sub(end) as f64 * 1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorRole;

    fn record(id: TensorId, shape: &[usize], dtype: &str) -> TensorRecord {
        let size = match dtype {
            "F16" | "BF16" => 2,
            _ => 4,
        };
        TensorRecord {
            id,
            bytes: shape.iter().product::<usize>() as u64 * size,
            dtype: dtype.into(),
            shape: shape.to_vec(),
            role: TensorRole::Other,
            producer: None,
        }
    }

    fn cost(name: &str, inputs: &[TensorRecord], outputs: &[TensorRecord]) -> OpCost {
        let op = OpRecord {
            name: name.into(),
            inputs: inputs.iter().map(|t| t.id).collect(),
            outputs: outputs.iter().map(|t| t.id).collect(),
            start_ns: 0,
            duration_ns: 1,
            thread: 1,
        };
        let all: Vec<&TensorRecord> = inputs.iter().chain(outputs).collect();
        op_cost(&op, |id| all.iter().copied().find(|t| t.id == id))
    }

    #[test]
    fn every_op_that_keeps_a_recipe_costs_what_its_bytes_and_elements_say() {
        // A recipe prices its op without shapes (`elementwise`): right only while every op
        // that keeps one is elementwise.
        let a = record(1, &[4, 8], "F32");
        let b = record(2, &[4, 8], "F32");
        let out = record(3, &[4, 8], "F32");
        for name in crate::policy::recompute::RECOMPUTABLE_OPS {
            let from_shapes = cost(
                name,
                &[a.clone(), b.clone(), a.clone()],
                std::slice::from_ref(&out),
            );
            assert_eq!(
                from_shapes,
                elementwise(256, 128, 32, MatrixDtype::F32),
                "{name}"
            );
        }
    }

    #[test]
    fn matmul_counts_two_flops_per_multiply_add() {
        // [8, 32, 64] x [8, 64, 16]: 8 * 32 * 16 outputs, 64 multiply-adds each.
        let c = cost(
            "float_matmul",
            &[
                record(1, &[8, 32, 64], "F32"),
                record(2, &[8, 64, 16], "F32"),
            ],
            &[record(3, &[8, 32, 16], "F32")],
        );
        assert_eq!(c.class, OpClass::Matrix);
        assert_eq!(c.matrix_flops, 2.0 * 8.0 * 32.0 * 16.0 * 64.0);
        assert_eq!(c.bytes, (8 * 32 * 64 + 8 * 64 * 16 + 8 * 32 * 16) * 4);
        // Broadcast batch: [4, 1, 5, 6] x [1, 3, 6, 7] -> [4, 3, 5, 7].
        let c = cost(
            "float_matmul",
            &[
                record(1, &[4, 1, 5, 6], "BF16"),
                record(2, &[1, 3, 6, 7], "BF16"),
            ],
            &[record(3, &[4, 3, 5, 7], "BF16")],
        );
        assert_eq!(c.matrix_flops, 2.0 * (4 * 3 * 5 * 7) as f64 * 6.0);
        assert_eq!(c.dtype, MatrixDtype::Bf16);
    }

    /// Worked by hand: a 3x3 convolution, stride 2, padding 1, on [2, 16, 32, 32] with 32
    /// filters: Ho = (32 + 2 - 3) / 2 + 1 = 16, so 2 * 32 * 16 * 16 = 16,384 outputs, each
    /// 16 * 3 * 3 = 144 multiply-adds: 2 * 16,384 * 144 = 4,718,592 FLOPs.
    #[test]
    fn conv2d_with_stride_padding_and_groups() {
        let x = record(1, &[2, 16, 32, 32], "F32");
        let w = record(2, &[32, 16, 3, 3], "F32");
        let b = record(3, &[32], "F32");
        let y = record(4, &[2, 32, 16, 16], "F32");
        let c = cost(
            "conv2d",
            &[x.clone(), w.clone(), b.clone()],
            std::slice::from_ref(&y),
        );
        assert_eq!(c.matrix_flops, 4_718_592.0);
        // Groups 4: the weight is [32, 16 / 4, 3, 3], a quarter of the multiply-adds.
        let wg = record(2, &[32, 4, 3, 3], "F32");
        let c = cost("conv2d", &[x.clone(), wg.clone()], std::slice::from_ref(&y));
        assert_eq!(c.matrix_flops, 4_718_592.0 / 4.0);
        // The backward ops do as many multiply-adds as the forward one.
        let dy = record(5, &[2, 32, 16, 16], "F32");
        let dx = record(6, &[2, 16, 32, 32], "F32");
        let c = cost(
            "conv2d_x_backward",
            &[x.clone(), w.clone(), dy.clone()],
            &[dx],
        );
        assert_eq!(c.matrix_flops, 4_718_592.0);
        let dw = record(7, &[32, 16, 3, 3], "F32");
        let c = cost("conv2d_weight_backward", &[x, w, dy], &[dw]);
        assert_eq!(c.matrix_flops, 4_718_592.0);
        // A transposed convolution: [1, 8, 5, 5] in, weight [8, 4, 3, 3]: 200 inputs, each
        // feeding 4 * 9 outputs.
        let c = cost(
            "conv_transpose2d",
            &[
                record(1, &[1, 8, 5, 5], "F32"),
                record(2, &[8, 4, 3, 3], "F32"),
            ],
            &[record(3, &[1, 4, 11, 11], "F32")],
        );
        assert_eq!(c.matrix_flops, 2.0 * 200.0 * 36.0);
    }

    /// Worked by hand: batch 2, 4 heads, 128 queries and keys of width 64. q k^T is
    /// 2 * 4 * 128 * 128 * 64 = 8,388,608 multiply-adds, the weights times v as many again:
    /// 2 FLOPs x 2 x 8,388,608 = 33,554,432 FLOPs.
    #[test]
    fn attention_counts_both_products() {
        let q = record(1, &[2, 4, 128, 64], "F16");
        let k = record(2, &[2, 4, 128, 64], "F16");
        let v = record(3, &[2, 4, 128, 64], "F16");
        let o = record(4, &[2, 4, 128, 64], "F16");
        let c = cost("attention", &[q, k, v], &[o]);
        assert_eq!(c.matrix_flops, 2.0 * 2.0 * (2 * 4 * 128 * 128 * 64) as f64);
        assert_eq!(c.matrix_flops, 33_554_432.0);
        assert_eq!(c.dtype, MatrixDtype::F16);
    }

    #[test]
    fn linear_and_its_backward_ops() {
        // x [4, 10, 32] through a [32, 48] weight.
        let x = record(1, &[4, 10, 32], "F32");
        let w = record(2, &[32, 48], "F32");
        let y = record(3, &[4, 10, 48], "F32");
        let forward = 2.0 * 4.0 * 10.0 * 32.0 * 48.0;
        assert_eq!(
            cost("linear", &[x.clone(), w.clone()], std::slice::from_ref(&y)).matrix_flops,
            forward
        );
        let dx = record(4, &[4, 10, 32], "F32");
        assert_eq!(
            cost("linear_x_backward", &[w.clone(), y.clone()], &[dx]).matrix_flops,
            forward
        );
        let dw = record(5, &[32, 48], "F32");
        assert_eq!(
            cost("linear_weight_backward", &[x, y], &[dw]).matrix_flops,
            forward
        );
    }

    #[test]
    fn elementwise_views_and_host_transfers() {
        let a = record(1, &[1024], "F32");
        let b = record(2, &[1024], "F32");
        let c = cost(
            "float_add",
            &[a.clone(), b.clone()],
            &[record(3, &[1024], "F32")],
        );
        assert_eq!((c.class, c.bytes), (OpClass::Memory, 3 * 4096));
        // An input read twice is read once.
        let c = cost(
            "float_mul",
            &[a.clone(), a.clone()],
            &[record(3, &[1024], "F32")],
        );
        assert_eq!(c.bytes, 2 * 4096);
        let c = cost(
            "float_reshape",
            std::slice::from_ref(&a),
            &[record(3, &[32, 32], "F32")],
        );
        assert_eq!(c.class, OpClass::View);
        let c = cost("float_into_data", std::slice::from_ref(&a), &[]);
        assert_eq!((c.class, c.bytes), (OpClass::ToHost, 4096));
        let c = cost("int_from_data", &[], &[record(3, &[1024], "I64")]);
        assert_eq!(c.class, OpClass::FromHost);
        // An unknown op falls back to memory-bound.
        let c = cost("some_new_op", &[a], &[b]);
        assert_eq!((c.class, c.bytes), (OpClass::Memory, 2 * 4096));
    }

    #[test]
    fn device_time_is_the_roofline_of_flops_and_bytes() {
        let p = DeviceProfile::builtin("h200-pcie5").unwrap();
        // A big bf16 matmul is compute bound: 2 * 4096^3 FLOPs at 0.6 * 835.5 TFLOP/s.
        let n = 4096;
        let c = cost(
            "float_matmul",
            &[record(1, &[n, n], "BF16"), record(2, &[n, n], "BF16")],
            &[record(3, &[n, n], "BF16")],
        );
        let t = device_seconds(&c, &p);
        let expected = 3e-6 + 2.0 * (n as f64).powi(3) / (835.5e12 * 0.6);
        assert!((t - expected).abs() < 1e-9, "{t} vs {expected}");
        // A big add is memory bound: 3 * 64 MiB at 0.8 * 4.8 TB/s.
        let m = 16 << 20;
        let c = cost(
            "float_add",
            &[record(1, &[m], "F32"), record(2, &[m], "F32")],
            &[record(3, &[m], "F32")],
        );
        let t = device_seconds(&c, &p);
        let expected = 3e-6 + (3 * 4 * m) as f64 / (4800e9 * 0.8);
        assert!((t - expected).abs() < 1e-9, "{t} vs {expected}");
    }
}
