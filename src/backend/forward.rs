//! The forwarding table macro.
//!
//! Each ops trait of Burn 0.21 is implemented for `SpillBackend<B>` by one `forward_ops!` table
//! that lists every method with the kind of each argument and of the result. The macro turns a
//! row such as
//!
//! ```text
//! fn float_cross(lhs: Float, rhs: Float, dim: {usize}) -> Float;
//! ```
//!
//! into a method that unwraps the `SpillTensor` arguments (moving the inner primitive when the
//! handle is unique, cloning it when shared), calls `B`'s own method of the same name, and wraps
//! the results in new handles. Kinds: `Float`, `Int`, `Bool`, `Quant`, `OptFloat`, `OptBool`,
//! `VecFloat`, `VecInt`, `VecBool`, `VecQuant`, `Prim` (`TensorPrimitive`), `QParams`, tuples of
//! kinds, the module output structs, and `{type}` for anything passed through untouched.
//! Rows are written against the generic parameter `B` of the surrounding impl.

/// The argument type of a kind in `SpillBackend<B>`'s signature.
macro_rules! spill_ty {
    (Float) => { $crate::SpillTensor<B> };
    (Int) => { $crate::SpillTensor<B> };
    (Bool) => { $crate::SpillTensor<B> };
    (Quant) => { $crate::SpillTensor<B> };
    (OptFloat) => { Option<$crate::SpillTensor<B>> };
    (OptBool) => { Option<$crate::SpillTensor<B>> };
    (VecFloat) => { Vec<$crate::SpillTensor<B>> };
    (VecInt) => { Vec<$crate::SpillTensor<B>> };
    (VecBool) => { Vec<$crate::SpillTensor<B>> };
    (VecQuant) => { Vec<$crate::SpillTensor<B>> };
    (Prim) => { ::burn_backend::TensorPrimitive<$crate::SpillBackend<B>> };
    (QParams) => {
        ::burn_backend::tensor::quantization::QuantizationParametersPrimitive<$crate::SpillBackend<B>>
    };
    (($($kind:tt),+)) => { ($($crate::backend::forward::spill_ty!($kind)),+) };
    (MaxPool1dWithIndices) => { ::burn_backend::ops::MaxPool1dWithIndices<$crate::SpillBackend<B>> };
    (MaxPool2dWithIndices) => { ::burn_backend::ops::MaxPool2dWithIndices<$crate::SpillBackend<B>> };
    (MaxPool1dBackward) => { ::burn_backend::ops::MaxPool1dBackward<$crate::SpillBackend<B>> };
    (MaxPool2dBackward) => { ::burn_backend::ops::MaxPool2dBackward<$crate::SpillBackend<B>> };
    (DeformConv2dBackward) => { ::burn_backend::ops::DeformConv2dBackward<$crate::SpillBackend<B>> };
    ({$($ty:tt)*}) => { $($ty)* };
}

/// Turns an argument of a kind into what `B`'s method takes.
macro_rules! spill_unwrap {
    (Float, $x:expr) => {
        $x.into_float()
    };
    (Int, $x:expr) => {
        $x.into_int()
    };
    (Bool, $x:expr) => {
        $x.into_bool()
    };
    (Quant, $x:expr) => {
        $x.into_quantized()
    };
    (OptFloat, $x:expr) => {
        $x.map(|t| t.into_float())
    };
    (OptBool, $x:expr) => {
        $x.map(|t| t.into_bool())
    };
    (VecFloat, $x:expr) => {
        $x.into_iter().map(|t| t.into_float()).collect()
    };
    (VecInt, $x:expr) => {
        $x.into_iter().map(|t| t.into_int()).collect()
    };
    (VecBool, $x:expr) => {
        $x.into_iter().map(|t| t.into_bool()).collect()
    };
    (VecQuant, $x:expr) => {
        $x.into_iter().map(|t| t.into_quantized()).collect()
    };
    (Prim, $x:expr) => {
        $crate::SpillTensor::<B>::into_tensor_primitive($x)
    };
    (QParams, $x:expr) => {
        ::burn_backend::tensor::quantization::QuantizationParametersPrimitive::<B> {
            scales: $x.scales.into_float(),
        }
    };
    ({$($ty:tt)*}, $x:expr) => {
        $x
    };
}

/// Wraps what `B`'s method returned into `SpillBackend<B>`'s result of a kind.
macro_rules! spill_wrap {
    (Float, $x:expr) => {
        $crate::SpillTensor::<B>::from_float($x)
    };
    (Int, $x:expr) => {
        $crate::SpillTensor::<B>::from_int($x)
    };
    (Bool, $x:expr) => {
        $crate::SpillTensor::<B>::from_bool($x)
    };
    (Quant, $x:expr) => {
        $crate::SpillTensor::<B>::from_quantized($x)
    };
    (Prim, $x:expr) => {
        $crate::SpillTensor::<B>::from_tensor_primitive($x)
    };
    (($k0:tt, $k1:tt), $x:expr) => {{
        let (a, b) = $x;
        (
            $crate::backend::forward::spill_wrap!($k0, a),
            $crate::backend::forward::spill_wrap!($k1, b),
        )
    }};
    (MaxPool1dWithIndices, $x:expr) => {{
        let out = $x;
        ::burn_backend::ops::MaxPool1dWithIndices::<$crate::SpillBackend<B>> {
            output: $crate::SpillTensor::<B>::from_float(out.output),
            indices: $crate::SpillTensor::<B>::from_int(out.indices),
        }
    }};
    (MaxPool2dWithIndices, $x:expr) => {{
        let out = $x;
        ::burn_backend::ops::MaxPool2dWithIndices::<$crate::SpillBackend<B>> {
            output: $crate::SpillTensor::<B>::from_float(out.output),
            indices: $crate::SpillTensor::<B>::from_int(out.indices),
        }
    }};
    (MaxPool1dBackward, $x:expr) => {
        ::burn_backend::ops::MaxPool1dBackward::<$crate::SpillBackend<B>> {
            x_grad: $crate::SpillTensor::<B>::from_float($x.x_grad),
        }
    };
    (MaxPool2dBackward, $x:expr) => {
        ::burn_backend::ops::MaxPool2dBackward::<$crate::SpillBackend<B>> {
            x_grad: $crate::SpillTensor::<B>::from_float($x.x_grad),
        }
    };
    (DeformConv2dBackward, $x:expr) => {{
        let out = $x;
        ::burn_backend::ops::DeformConv2dBackward::<$crate::SpillBackend<B>> {
            x_grad: $crate::SpillTensor::<B>::from_float(out.x_grad),
            offset_grad: $crate::SpillTensor::<B>::from_float(out.offset_grad),
            weight_grad: $crate::SpillTensor::<B>::from_float(out.weight_grad),
            mask_grad: out.mask_grad.map($crate::SpillTensor::<B>::from_float),
            bias_grad: out.bias_grad.map($crate::SpillTensor::<B>::from_float),
        }
    }};
    ({$($ty:tt)*}, $x:expr) => {
        $x
    };
}

/// Generates forwarding methods for the rows of one ops trait (see the module docs).
macro_rules! forward_ops {
    ($ops:ident; $( fn $name:ident ( $( $arg:ident : $kind:tt ),* $(,)? ) -> $out:tt ; )*) => {
        $(
            fn $name( $( $arg : $crate::backend::forward::spill_ty!($kind) ),* )
                -> $crate::backend::forward::spill_ty!($out)
            {
                let result = <B as $ops<B>>::$name(
                    $( $crate::backend::forward::spill_unwrap!($kind, $arg) ),*
                );
                $crate::backend::forward::spill_wrap!($out, result)
            }
        )*
    };
}

pub(crate) use {forward_ops, spill_ty, spill_unwrap, spill_wrap};
