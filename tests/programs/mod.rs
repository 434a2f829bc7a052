//! The random op programs of `tests/tiers_programs.rs`: an instruction set over a register
//! file of live tensors, its proptest strategies, and the machine that runs a program on any
//! backend and records what it read (`mod programs;` in a test binary that also mounts
//! `common`). See `tests/tiers_programs.rs` for what the instructions cover.

#![allow(dead_code)] // each test binary uses some of these

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, DType, FloatDType, Int, IntDType, Tensor, TensorData, Transaction};
use burn_spill::SpillConfig;
use proptest::prelude::*;

use crate::common::{Spill, assert_same_data};

// ---------------------------------------------------------------------------------------------
// The instruction set.
// ---------------------------------------------------------------------------------------------

const SHAPES: [[usize; 3]; 3] = [[1, 1, 4], [1, 3, 4], [2, 3, 4]];
const FLOATS: [FloatDType; 3] = [FloatDType::F32, FloatDType::F16, FloatDType::BF16];
const INTS: [IntDType; 2] = [IntDType::I32, IntDType::I64];
/// Most registers alive at once; past it the oldest register is dropped.
const MAX_REGS: usize = 10;
/// Int results are clamped to this so that no chain of ops overflows (debug builds of Flex
/// panic on integer overflow).
const INT_BOUND: i64 = 10_000;

/// What a `Create` makes.
#[derive(Debug, Clone, Copy)]
pub enum Ty {
    /// A float of `FLOATS[i]`; `via_cast` creates it in f32 and casts (an op), otherwise the
    /// data is converted on the host and uploaded in the target dtype.
    Float {
        i: u8,
        via_cast: bool,
    },
    Int {
        i: u8,
    },
    Bool,
}

#[derive(Debug, Clone, Copy)]
pub enum Unary {
    Exp,
    Tanh,
    Neg,
    Abs,
    SqrtAbs,
}

#[derive(Debug, Clone, Copy)]
pub enum Binary {
    Add,
    Mul,
    Sub,
    Max,
}

#[derive(Debug, Clone, Copy)]
pub enum ScalarOp {
    Add,
    Mul,
    Clamp,
}

#[derive(Debug, Clone, Copy)]
pub enum Cmp {
    Greater,
    LowerEqual,
    Equal,
}

#[derive(Debug, Clone, Copy)]
pub enum BoolOp {
    Not,
    And,
    Or,
}

/// One instruction. `a`, `b`, `m` name registers (modulo the live count, then the first
/// register from there of the kind the instruction needs); `keep` = false consumes the operand
/// (its register is replaced by the result, so a unique handle is moved into the op and the
/// backend may work in place), `keep` = true clones it and appends the result.
#[derive(Debug, Clone)]
pub enum Inst {
    Create {
        ty: Ty,
        shape: u8,
        seed: u32,
    },
    Unary {
        op: Unary,
        a: u8,
        keep: bool,
    },
    Binary {
        op: Binary,
        a: u8,
        b: u8,
        keep: bool,
    },
    Scalar {
        op: ScalarOp,
        a: u8,
        v: i8,
        keep: bool,
    },
    Matmul {
        a: u8,
        b: u8,
    },
    Reshape {
        a: u8,
        to: u8,
        keep: bool,
    },
    SwapDims {
        a: u8,
        pair: u8,
    },
    Slice {
        a: u8,
        dim: u8,
        from_start: bool,
    },
    Reduce {
        a: u8,
        dim: u8,
        mean: bool,
    },
    Compare {
        op: Cmp,
        a: u8,
        b: u8,
    },
    MaskWhere {
        m: u8,
        a: u8,
        b: u8,
    },
    MaskFill {
        m: u8,
        a: u8,
        v: i8,
    },
    Cast {
        a: u8,
        to: u8,
    },
    Argmax {
        a: u8,
        dim: u8,
    },
    Bools {
        op: BoolOp,
        a: u8,
        b: u8,
    },
    Clone {
        a: u8,
    },
    CloneMutate {
        a: u8,
        b: u8,
    },
    Drop {
        a: u8,
    },
    Read {
        a: u8,
        keep: bool,
    },
    /// Moves a register to another thread and drops it there.
    DropOnThread {
        a: u8,
    },
    /// Reads up to three registers in one `Transaction`.
    ReadMany {
        a: u8,
        b: u8,
        c: u8,
    },
    /// `max_dim_with_indices`: an op with a float and an int output.
    MaxWithIndices {
        a: u8,
        dim: u8,
    },
    /// Concatenates a register with a partner of the same kind, dtype and shape.
    Cat {
        a: u8,
        b: u8,
        dim: u8,
    },
    /// Reconfigures the device mid-program (`None` = unlimited), with tensors on every tier.
    /// Only in the mixed-tiers property; a no-op for plain Flex.
    Reconfigure {
        budget: Option<u16>,
        host: Option<u16>,
    },
}

fn ty() -> impl Strategy<Value = Ty> {
    prop_oneof![
        3 => (0u8..3, any::<bool>()).prop_map(|(i, via_cast)| Ty::Float { i, via_cast }),
        1 => (0u8..2).prop_map(|i| Ty::Int { i }),
        1 => Just(Ty::Bool),
    ]
}

fn inst() -> impl Strategy<Value = Inst> {
    let r = any::<u8>;
    prop_oneof![
        4 => (ty(), 0u8..3, any::<u32>()).prop_map(|(ty, shape, seed)| Inst::Create { ty, shape, seed }),
        3 => (prop_oneof![Just(Unary::Exp), Just(Unary::Tanh), Just(Unary::Neg), Just(Unary::Abs), Just(Unary::SqrtAbs)], r(), any::<bool>())
            .prop_map(|(op, a, keep)| Inst::Unary { op, a, keep }),
        4 => (prop_oneof![Just(Binary::Add), Just(Binary::Mul), Just(Binary::Sub), Just(Binary::Max)], r(), r(), any::<bool>())
            .prop_map(|(op, a, b, keep)| Inst::Binary { op, a, b, keep }),
        2 => (prop_oneof![Just(ScalarOp::Add), Just(ScalarOp::Mul), Just(ScalarOp::Clamp)], r(), any::<i8>(), any::<bool>())
            .prop_map(|(op, a, v, keep)| Inst::Scalar { op, a, v, keep }),
        2 => (r(), r()).prop_map(|(a, b)| Inst::Matmul { a, b }),
        2 => (r(), r(), any::<bool>()).prop_map(|(a, to, keep)| Inst::Reshape { a, to, keep }),
        1 => (r(), r()).prop_map(|(a, pair)| Inst::SwapDims { a, pair }),
        2 => (r(), r(), any::<bool>()).prop_map(|(a, dim, from_start)| Inst::Slice { a, dim, from_start }),
        2 => (r(), r(), any::<bool>()).prop_map(|(a, dim, mean)| Inst::Reduce { a, dim, mean }),
        2 => (prop_oneof![Just(Cmp::Greater), Just(Cmp::LowerEqual), Just(Cmp::Equal)], r(), r())
            .prop_map(|(op, a, b)| Inst::Compare { op, a, b }),
        2 => (r(), r(), r()).prop_map(|(m, a, b)| Inst::MaskWhere { m, a, b }),
        1 => (r(), r(), any::<i8>()).prop_map(|(m, a, v)| Inst::MaskFill { m, a, v }),
        2 => (r(), r()).prop_map(|(a, to)| Inst::Cast { a, to }),
        1 => (r(), r()).prop_map(|(a, dim)| Inst::Argmax { a, dim }),
        1 => (prop_oneof![Just(BoolOp::Not), Just(BoolOp::And), Just(BoolOp::Or)], r(), r())
            .prop_map(|(op, a, b)| Inst::Bools { op, a, b }),
        2 => r().prop_map(|a| Inst::Clone { a }),
        2 => (r(), r()).prop_map(|(a, b)| Inst::CloneMutate { a, b }),
        1 => r().prop_map(|a| Inst::Drop { a }),
        2 => (r(), any::<bool>()).prop_map(|(a, keep)| Inst::Read { a, keep }),
        1 => r().prop_map(|a| Inst::DropOnThread { a }),
        1 => (r(), r(), r()).prop_map(|(a, b, c)| Inst::ReadMany { a, b, c }),
        1 => (r(), r()).prop_map(|(a, dim)| Inst::MaxWithIndices { a, dim }),
        1 => (r(), r(), r()).prop_map(|(a, b, dim)| Inst::Cat { a, b, dim }),
    ]
}

/// A program with reconfigurations in it.
pub fn program_with_reconfigure(max_len: usize) -> impl Strategy<Value = Vec<Inst>> {
    let small = || prop_oneof![1 => Just(None), 3 => (0u16..1024).prop_map(Some)];
    let reconfigure =
        (small(), small()).prop_map(|(budget, host)| Inst::Reconfigure { budget, host });
    let step = prop_oneof![12 => inst(), 1 => reconfigure];
    (program(2), proptest::collection::vec(step, 1..max_len)).prop_map(|(mut a, b)| {
        a.extend(b);
        a
    })
}

/// A program: a few creations first (so budget 0 always has something to spill), then random
/// instructions.
pub fn program(max_len: usize) -> impl Strategy<Value = Vec<Inst>> {
    let first =
        (ty(), 0u8..3, any::<u32>()).prop_map(|(ty, shape, seed)| Inst::Create { ty, shape, seed });
    (
        proptest::collection::vec(first, 2..4),
        proptest::collection::vec(inst(), 1..max_len),
    )
        .prop_map(|(mut a, b)| {
            a.extend(b);
            a
        })
}

// ---------------------------------------------------------------------------------------------
// The machine.
// ---------------------------------------------------------------------------------------------

enum Reg<B: Backend> {
    F(Tensor<B, 3>),
    I(Tensor<B, 3, Int>),
    B(Tensor<B, 3, Bool>),
}

impl<B: Backend> Clone for Reg<B> {
    fn clone(&self) -> Self {
        match self {
            Reg::F(t) => Reg::F(t.clone()),
            Reg::I(t) => Reg::I(t.clone()),
            Reg::B(t) => Reg::B(t.clone()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    F,
    I,
    B,
}

impl<B: Backend> Reg<B> {
    fn kind(&self) -> Kind {
        match self {
            Reg::F(_) => Kind::F,
            Reg::I(_) => Kind::I,
            Reg::B(_) => Kind::B,
        }
    }

    fn dtype(&self) -> DType {
        match self {
            Reg::F(t) => t.dtype(),
            Reg::I(t) => t.dtype(),
            Reg::B(t) => t.dtype(),
        }
    }

    fn dims(&self) -> [usize; 3] {
        match self {
            Reg::F(t) => t.dims(),
            Reg::I(t) => t.dims(),
            Reg::B(t) => t.dims(),
        }
    }

    fn bytes(&self) -> u64 {
        (self.dims().iter().product::<usize>() * self.dtype().size()) as u64
    }

    fn read(self) -> TensorData {
        match self {
            Reg::F(t) => t.into_data(),
            Reg::I(t) => t.into_data(),
            Reg::B(t) => t.into_data(),
        }
    }

    fn describe(&self) -> String {
        format!("{:?}{:?}{:?}", self.kind(), self.dtype(), self.dims())
    }
}

/// A small deterministic generator for tensor values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Float values: signed zeros, halves and quarters, and some not representable in f16 or bf16
/// (0.1, 1/3, 1000.0625), so casts and creation in the lower precisions round.
const FLOAT_VALUES: [f32; 16] = [
    0.0,
    -0.0,
    0.5,
    -0.5,
    1.0,
    -1.25,
    2.0,
    3.5,
    -3.0,
    0.1,
    1000.0625,
    -7.75,
    0.333_333_34,
    1e-3,
    -0.875,
    1.5,
];

fn clamp_int<B: Backend>(t: Tensor<B, 3, Int>) -> Tensor<B, 3, Int> {
    t.clamp(-INT_BOUND, INT_BOUND)
}

/// Every `[d0, d1, d2]` with `d0 * d1 * d2 == n`.
fn factorizations(n: usize) -> Vec<[usize; 3]> {
    let mut out = Vec::new();
    for d0 in 1..=n {
        if !n.is_multiple_of(d0) {
            continue;
        }
        for d1 in 1..=n / d0 {
            if (n / d0).is_multiple_of(d1) {
                out.push([d0, d1, n / d0 / d1]);
            }
        }
    }
    out
}

/// What one run produced: the log of executed instructions, every read in order (then every
/// register at the end), and the peak of the registers' bytes.
#[derive(Default)]
pub struct Outcome {
    pub log: Vec<String>,
    pub data: Vec<TensorData>,
    pub peak_bytes: u64,
}

struct Machine<B: Backend> {
    regs: Vec<Reg<B>>,
    /// Under autodiff: the f32 creations marked `require_grad`, kept for their gradients.
    leaves: Vec<Tensor<B, 3>>,
    grad: bool,
    out: Outcome,
    device: B::Device,
}

impl<B: Backend> Machine<B> {
    fn new(grad: bool) -> Self {
        Self {
            regs: Vec::new(),
            leaves: Vec::new(),
            grad,
            out: Outcome::default(),
            device: Default::default(),
        }
    }

    fn push(&mut self, r: Reg<B>) {
        self.regs.push(r);
        if self.regs.len() > MAX_REGS {
            self.regs.remove(0);
        }
    }

    /// The first register at or after `at` (cyclically) that satisfies `pred`.
    fn find(&self, at: u8, pred: impl Fn(&Reg<B>) -> bool) -> Option<usize> {
        let n = self.regs.len();
        if n == 0 {
            return None;
        }
        let start = at as usize % n;
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| pred(&self.regs[i]))
    }

    /// A register of kind float or int.
    fn find_numeric(&self, at: u8) -> Option<usize> {
        self.find(at, |r| r.kind() != Kind::B)
    }

    /// A partner of register `i`: same kind, dtype and shape (possibly `i` itself).
    fn partner(&self, i: usize, at: u8) -> usize {
        let (k, d, s) = (
            self.regs[i].kind(),
            self.regs[i].dtype(),
            self.regs[i].dims(),
        );
        self.find(at, |r| r.kind() == k && r.dtype() == d && r.dims() == s)
            .unwrap_or(i)
    }

    /// The operand in register `i`: cloned when `keep`, taken out otherwise (the result then
    /// goes back in its place).
    fn operand(&mut self, i: usize, keep: bool) -> Reg<B> {
        if keep {
            self.regs[i].clone()
        } else {
            self.regs.remove(i)
        }
    }

    fn put(&mut self, i: usize, keep: bool, r: Reg<B>) {
        if keep {
            self.push(r);
        } else {
            self.regs.insert(i, r);
        }
    }

    fn log(&mut self, what: String) {
        self.out.log.push(what);
    }

    fn run(&mut self, program: &[Inst]) {
        for (pc, inst) in program.iter().enumerate() {
            let done = self.step(inst);
            let regs: Vec<String> = self.regs.iter().map(Reg::describe).collect();
            self.log(format!("{pc}: {inst:?} => {done} | {}", regs.join(" ")));
            let bytes: u64 = self.regs.iter().map(Reg::bytes).sum();
            self.out.peak_bytes = self.out.peak_bytes.max(bytes);
        }
    }

    /// Executes one instruction and says what it did.
    fn step(&mut self, inst: &Inst) -> &'static str {
        let dev = self.device.clone();
        match *inst {
            Inst::Create { ty, shape, seed } => {
                let shape = SHAPES[shape as usize % SHAPES.len()];
                let n: usize = shape.iter().product();
                let mut rng = Rng(seed as u64);
                let r = match ty {
                    Ty::Float { i, via_cast } => {
                        let values: Vec<f32> = (0..n)
                            .map(|_| FLOAT_VALUES[(rng.next() % 16) as usize])
                            .collect();
                        let data = TensorData::new(values, shape);
                        let dtype = FLOATS[i as usize % FLOATS.len()];
                        let t = if via_cast {
                            Tensor::<B, 3>::from_data(data, (&dev, DType::F32)).cast(dtype)
                        } else {
                            Tensor::<B, 3>::from_data(data, (&dev, DType::from(dtype)))
                        };
                        let t = if self.grad && dtype == FloatDType::F32 {
                            let t = t.require_grad();
                            self.leaves.push(t.clone());
                            t
                        } else {
                            t
                        };
                        Reg::F(t)
                    }
                    Ty::Int { i } => {
                        let values: Vec<i64> =
                            (0..n).map(|_| (rng.next() % 101) as i64 - 50).collect();
                        let dtype = INTS[i as usize % INTS.len()];
                        Reg::I(Tensor::<B, 3, Int>::from_data(
                            TensorData::new(values, shape),
                            (&dev, DType::from(dtype)),
                        ))
                    }
                    Ty::Bool => {
                        let values: Vec<bool> =
                            (0..n).map(|_| rng.next().is_multiple_of(2)).collect();
                        Reg::B(Tensor::<B, 3, Bool>::from_data(
                            TensorData::new(values, shape),
                            &dev,
                        ))
                    }
                };
                self.push(r);
                "created"
            }
            Inst::Unary { op, a, keep } => {
                let Some(i) = self.find(a, |r| r.kind() == Kind::F) else {
                    return "skip";
                };
                let Reg::F(t) = self.operand(i, keep) else {
                    unreachable!()
                };
                let t = match op {
                    Unary::Exp => t.exp(),
                    Unary::Tanh => t.tanh(),
                    Unary::Neg => t.neg(),
                    Unary::Abs => t.abs(),
                    Unary::SqrtAbs => t.abs().sqrt(),
                };
                self.put(i, keep, Reg::F(t));
                "float unary"
            }
            Inst::Binary { op, a, b, keep } => {
                let Some(i) = self.find_numeric(a) else {
                    return "skip";
                };
                let j = self.partner(i, b);
                let rhs = self.regs[j].clone();
                let r = match (self.operand(i, keep), rhs) {
                    (Reg::F(x), Reg::F(y)) => Reg::F(match op {
                        Binary::Add => x + y,
                        Binary::Mul => x * y,
                        Binary::Sub => x - y,
                        Binary::Max => x.max_pair(y),
                    }),
                    (Reg::I(x), Reg::I(y)) => Reg::I(clamp_int(match op {
                        Binary::Add => x + y,
                        Binary::Mul => x * y,
                        Binary::Sub => x - y,
                        Binary::Max => x.max_pair(y),
                    })),
                    _ => unreachable!(),
                };
                self.put(i, keep, r);
                if i == j {
                    "binary with itself"
                } else {
                    "binary"
                }
            }
            Inst::Scalar { op, a, v, keep } => {
                let Some(i) = self.find_numeric(a) else {
                    return "skip";
                };
                let r = match self.operand(i, keep) {
                    Reg::F(x) => {
                        let s = v as f32 / 4.0;
                        Reg::F(match op {
                            ScalarOp::Add => x.add_scalar(s),
                            ScalarOp::Mul => x.mul_scalar(s),
                            ScalarOp::Clamp => x.clamp(-s.abs(), s.abs()),
                        })
                    }
                    Reg::I(x) => {
                        let s = v as i64;
                        Reg::I(match op {
                            ScalarOp::Add => clamp_int(x.add_scalar(s)),
                            ScalarOp::Mul => clamp_int(x.mul_scalar(s % 4)),
                            ScalarOp::Clamp => x.clamp(-s.abs(), s.abs()),
                        })
                    }
                    Reg::B(_) => unreachable!(),
                };
                self.put(i, keep, r);
                "scalar"
            }
            Inst::Matmul { a, b } => {
                let Some(i) = self.find(a, |r| r.kind() == Kind::F) else {
                    return "skip";
                };
                let (dt, [b0, _, k]) = (self.regs[i].dtype(), self.regs[i].dims());
                let j = self.find(b, |r| {
                    r.kind() == Kind::F && r.dtype() == dt && r.dims()[0] == b0 && r.dims()[1] == k
                });
                let Reg::F(x) = self.regs[i].clone() else {
                    unreachable!()
                };
                let (y, what) = match j {
                    Some(j) => {
                        let Reg::F(y) = self.regs[j].clone() else {
                            unreachable!()
                        };
                        (y, "matmul")
                    }
                    None => (x.clone().transpose(), "matmul with own transpose"),
                };
                self.push(Reg::F(x.matmul(y)));
                what
            }
            Inst::Reshape { a, to, keep } => {
                let i = a as usize % self.regs.len().max(1);
                if self.regs.is_empty() {
                    return "skip";
                }
                let n: usize = self.regs[i].dims().iter().product();
                let shapes = factorizations(n);
                let to = shapes[to as usize % shapes.len()];
                let r = match self.operand(i, keep) {
                    Reg::F(t) => Reg::F(t.reshape(to)),
                    Reg::I(t) => Reg::I(t.reshape(to)),
                    // Through rank 1 and back: two reshapes.
                    Reg::B(t) => Reg::B(t.reshape([n]).reshape(to)),
                };
                self.put(i, keep, r);
                "reshape"
            }
            Inst::SwapDims { a, pair } => {
                if self.regs.is_empty() {
                    return "skip";
                }
                let i = a as usize % self.regs.len();
                let (d1, d2) = [(0, 1), (1, 2), (0, 2)][pair as usize % 3];
                let r = match self.regs[i].clone() {
                    Reg::F(t) => Reg::F(t.swap_dims(d1, d2)),
                    Reg::I(t) => Reg::I(t.swap_dims(d1, d2)),
                    Reg::B(t) => Reg::B(t.swap_dims(d1, d2)),
                };
                self.push(r);
                "swap dims"
            }
            Inst::Slice { a, dim, from_start } => {
                let Some(i) = self.find(a, |r| r.dims().iter().any(|&d| d > 1)) else {
                    return "skip";
                };
                let dims = self.regs[i].dims();
                let d = (0..3)
                    .map(|k| (dim as usize + k) % 3)
                    .find(|&k| dims[k] > 1)
                    .unwrap();
                let mut ranges = [0..dims[0], 0..dims[1], 0..dims[2]];
                ranges[d] = if from_start {
                    0..dims[d] - 1
                } else {
                    1..dims[d]
                };
                let r = match self.regs[i].clone() {
                    Reg::F(t) => Reg::F(t.slice(ranges)),
                    Reg::I(t) => Reg::I(t.slice(ranges)),
                    Reg::B(t) => Reg::B(t.slice(ranges)),
                };
                self.push(r);
                "slice"
            }
            Inst::Reduce { a, dim, mean } => {
                let Some(i) = self.find_numeric(a) else {
                    return "skip";
                };
                let d = dim as usize % 3;
                let r = match self.regs[i].clone() {
                    Reg::F(t) => Reg::F(if mean { t.mean_dim(d) } else { t.sum_dim(d) }),
                    Reg::I(t) => Reg::I(clamp_int(if mean { t.mean_dim(d) } else { t.sum_dim(d) })),
                    Reg::B(_) => unreachable!(),
                };
                self.push(r);
                "reduce"
            }
            Inst::Compare { op, a, b } => {
                let Some(i) = self.find_numeric(a) else {
                    return "skip";
                };
                let j = self.partner(i, b);
                let m = match (self.regs[i].clone(), self.regs[j].clone()) {
                    (Reg::F(x), Reg::F(y)) => match op {
                        Cmp::Greater => x.greater(y),
                        Cmp::LowerEqual => x.lower_equal(y),
                        Cmp::Equal if i == j => x.greater_elem(0.25),
                        Cmp::Equal => x.equal(y),
                    },
                    (Reg::I(x), Reg::I(y)) => match op {
                        Cmp::Greater => x.greater(y),
                        Cmp::LowerEqual => x.lower_equal(y),
                        Cmp::Equal if i == j => x.greater_elem(0),
                        Cmp::Equal => x.equal(y),
                    },
                    _ => unreachable!(),
                };
                self.push(Reg::B(m));
                "compare"
            }
            Inst::MaskWhere { m, a, b } => {
                let Some(i) = self.find_numeric(a) else {
                    return "skip";
                };
                let j = self.partner(i, b);
                let dims = self.regs[i].dims();
                let mask = self.find(m, |r| r.kind() == Kind::B && r.dims() == dims);
                let (mask, what) = match mask {
                    Some(k) => {
                        let Reg::B(mask) = self.regs[k].clone() else {
                            unreachable!()
                        };
                        (mask, "mask_where")
                    }
                    None => (
                        match self.regs[i].clone() {
                            Reg::F(t) => t.lower_elem(0.0),
                            Reg::I(t) => t.lower_elem(0),
                            Reg::B(_) => unreachable!(),
                        },
                        "mask_where by own sign",
                    ),
                };
                let r = match (self.regs[i].clone(), self.regs[j].clone()) {
                    (Reg::F(x), Reg::F(y)) => Reg::F(x.mask_where(mask, y.neg())),
                    (Reg::I(x), Reg::I(y)) => Reg::I(x.mask_where(mask, y.neg())),
                    _ => unreachable!(),
                };
                self.push(r);
                what
            }
            Inst::MaskFill { m, a, v } => {
                let Some(k) = self.find(m, |r| r.kind() == Kind::B) else {
                    return "skip";
                };
                let dims = self.regs[k].dims();
                let Some(i) = self.find(a, |r| r.kind() != Kind::B && r.dims() == dims) else {
                    return "skip";
                };
                let Reg::B(mask) = self.regs[k].clone() else {
                    unreachable!()
                };
                let r = match self.operand(i, false) {
                    Reg::F(t) => Reg::F(t.mask_fill(mask, v as f32 / 8.0)),
                    Reg::I(t) => Reg::I(t.mask_fill(mask, v as i64)),
                    Reg::B(_) => unreachable!(),
                };
                self.put(i, false, r);
                "mask_fill"
            }
            Inst::Cast { a, to } => {
                if self.regs.is_empty() {
                    return "skip";
                }
                let i = a as usize % self.regs.len();
                let (r, what) = match self.regs[i].clone() {
                    Reg::F(t) if to % 4 == 3 => (
                        Reg::I(t.clamp(-100.0, 100.0).cast(INTS[(to / 4) as usize % 2])),
                        "float to int",
                    ),
                    Reg::F(t) => (Reg::F(t.cast(FLOATS[to as usize % 4])), "float to float"),
                    Reg::I(t) if to % 2 == 0 => {
                        (Reg::I(t.cast(INTS[(to / 2) as usize % 2])), "int to int")
                    }
                    Reg::I(t) => (
                        Reg::F(t.cast(FLOATS[(to / 2) as usize % 3])),
                        "int to float",
                    ),
                    Reg::B(t) if to % 2 == 0 => (Reg::I(t.int()), "bool to int"),
                    Reg::B(t) => (Reg::F(t.float()), "bool to float"),
                };
                self.push(r);
                what
            }
            Inst::Argmax { a, dim } => {
                let Some(i) = self.find_numeric(a) else {
                    return "skip";
                };
                let d = dim as usize % 3;
                let r = match self.regs[i].clone() {
                    Reg::F(t) => t.argmax(d),
                    Reg::I(t) => t.argmax(d),
                    Reg::B(_) => unreachable!(),
                };
                self.push(Reg::I(r));
                "argmax"
            }
            Inst::Bools { op, a, b } => {
                let Some(i) = self.find(a, |r| r.kind() == Kind::B) else {
                    return "skip";
                };
                let j = self.partner(i, b);
                let (Reg::B(x), Reg::B(y)) = (self.regs[i].clone(), self.regs[j].clone()) else {
                    unreachable!()
                };
                let r = match op {
                    BoolOp::Not => x.bool_not(),
                    BoolOp::And => x.bool_and(y),
                    BoolOp::Or => x.bool_or(y),
                };
                self.push(Reg::B(r));
                "bool op"
            }
            Inst::Clone { a } => {
                if self.regs.is_empty() {
                    return "skip";
                }
                let r = self.regs[a as usize % self.regs.len()].clone();
                self.push(r);
                "clone"
            }
            Inst::CloneMutate { a, b } => {
                let Some(i) = self.find_numeric(a) else {
                    return "skip";
                };
                let j = self.partner(i, b);
                let before = self.regs[i].clone().read();
                // The clone shares the handle with register `i`; adding consumes it, which must
                // not write into the buffer register `i` still reads.
                let shared = self.regs[i].clone();
                let other = self.regs[j].clone();
                let r = match (shared, other) {
                    (Reg::F(x), Reg::F(y)) => Reg::F(x + y),
                    (Reg::I(x), Reg::I(y)) => Reg::I(clamp_int(x + y)),
                    _ => unreachable!(),
                };
                let after = self.regs[i].clone().read();
                assert_same_data(&before, &after, "a clone consumed by add changed its twin");
                self.out.data.push(before);
                self.push(r);
                "clone then mutate"
            }
            Inst::Drop { a } => {
                if self.regs.is_empty() {
                    return "skip";
                }
                let i = a as usize % self.regs.len();
                self.regs.remove(i);
                "drop"
            }
            Inst::Read { a, keep } => {
                if self.regs.is_empty() {
                    return "skip";
                }
                let i = a as usize % self.regs.len();
                let data = self.operand(i, keep).read();
                self.out.data.push(data);
                if keep { "read" } else { "read and drop" }
            }
            Inst::DropOnThread { .. }
            | Inst::ReadMany { .. }
            | Inst::MaxWithIndices { .. }
            | Inst::Cat { .. } => self.step_more(inst),
            Inst::Reconfigure { budget, host } => {
                let config = match budget {
                    Some(b) => SpillConfig::default().device_budget_bytes(b as u64),
                    None => SpillConfig::default(),
                };
                let config = match host {
                    Some(h) => config.host_limit_bytes(h as u64),
                    None => config.unlimited_host(),
                };
                Spill::configure(&Default::default(), config).unwrap();
                "reconfigure"
            }
        }
    }

    /// The new instructions: threads, transactions, two outputs, many inputs.
    fn step_more(&mut self, inst: &Inst) -> &'static str {
        match *inst {
            Inst::DropOnThread { a } => {
                if self.regs.is_empty() {
                    return "skip";
                }
                let r = self.regs.remove(a as usize % self.regs.len());
                std::thread::spawn(move || drop(r))
                    .join()
                    .expect("drop on another thread");
                "drop on another thread"
            }
            Inst::ReadMany { a, b, c } => {
                if self.regs.is_empty() {
                    return "skip";
                }
                let n = self.regs.len();
                let mut tr = Transaction::default();
                for i in [a, b, c] {
                    tr = match self.regs[i as usize % n].clone() {
                        Reg::F(t) => tr.register(t),
                        Reg::I(t) => tr.register(t),
                        Reg::B(t) => tr.register(t),
                    };
                }
                self.out.data.extend(tr.execute());
                "transaction"
            }
            Inst::MaxWithIndices { a, dim } => {
                let Some(i) = self.find(a, |r| r.kind() == Kind::F) else {
                    return "skip";
                };
                let Reg::F(t) = self.regs[i].clone() else {
                    unreachable!()
                };
                let (values, indices) = t.max_dim_with_indices(dim as usize % 3);
                self.push(Reg::F(values));
                self.push(Reg::I(indices));
                "max with indices"
            }
            Inst::Cat { a, b, dim } => {
                if self.regs.is_empty() {
                    return "skip";
                }
                let i = a as usize % self.regs.len();
                let j = self.partner(i, b);
                let d = dim as usize % 3;
                let r = match (self.regs[i].clone(), self.regs[j].clone()) {
                    (Reg::F(x), Reg::F(y)) => Reg::F(Tensor::cat(vec![x, y], d)),
                    (Reg::I(x), Reg::I(y)) => Reg::I(Tensor::cat(vec![x, y], d)),
                    (Reg::B(x), Reg::B(y)) => Reg::B(Tensor::cat(vec![x, y], d)),
                    _ => unreachable!(),
                };
                self.push(r);
                "cat"
            }
            _ => unreachable!("step handles the others"),
        }
    }

    /// Reads every register (clones, so the registers stay for a loss).
    fn read_all(&mut self) {
        let data: Vec<TensorData> = self.regs.iter().map(|r| r.clone().read()).collect();
        self.out.data.extend(data);
    }
}

/// Runs `program` on backend `B` and returns everything it read.
pub fn run<B: Backend>(program: &[Inst]) -> Outcome {
    let mut m = Machine::<B>::new(false);
    m.run(program);
    m.read_all();
    m.out
}

/// Runs `program` under autodiff with the f32 creations requiring grad, then backpropagates the
/// sum of every float register (cast to f32) and appends the loss and every leaf's gradient.
pub fn run_grad<B: AutodiffBackend>(program: &[Inst]) -> Outcome {
    let mut m = Machine::<B>::new(true);
    m.run(program);
    m.read_all();
    let device: B::Device = Default::default();
    let mut loss = Tensor::<B, 1>::zeros([1], &device);
    for r in &m.regs {
        if let Reg::F(t) = r {
            loss = loss + t.clone().cast(FloatDType::F32).sum();
        }
    }
    for leaf in &m.leaves {
        // Leaves that fell out of the registers still get a gradient (of zero weight) this way.
        loss = loss + leaf.clone().sum().mul_scalar(0.5);
    }
    if m.leaves.is_empty() {
        // Nothing requires grad: autodiff would refuse the backward pass.
        m.out.data.push(loss.into_data());
        return m.out;
    }
    let grads = loss.backward();
    m.out.data.push(loss.into_data());
    for (k, leaf) in m.leaves.iter().enumerate() {
        match leaf.grad(&grads) {
            Some(g) => m.out.data.push(g.into_data()),
            None => m.out.log.push(format!("leaf {k} has no gradient")),
        }
    }
    m.out
}

/// Requires `spill` to have run the same instructions as `plain` and read the same bits.
pub fn compare(what: &str, plain: &Outcome, spill: &Outcome) {
    assert_eq!(
        plain.log, spill.log,
        "{what}: the runs executed different programs"
    );
    assert_eq!(
        plain.data.len(),
        spill.data.len(),
        "{what}: number of reads"
    );
    for (k, (p, s)) in plain.data.iter().zip(&spill.data).enumerate() {
        assert_same_data(p, s, &format!("{what}: read {k}"));
    }
}
