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
//! into a method that notes the `SpillTensor` arguments in an [`OpScope`](super::op_scope::OpScope)
//! (which makes room under the device budget), unwraps them (restoring spilled bytes, moving the
//! inner primitive when the handle is unique, cloning it when shared), calls `B`'s own method of
//! the same name, and wraps the results in new handles that the scope hands to the engine. Kinds: `Float`, `Int`, `Bool`, `Quant`, `OptFloat`, `OptBool`,
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

/// Tells the op scope about the tensors an argument of a kind holds.
macro_rules! spill_note {
    (Float, $x:expr, $op:ident) => {
        $op.input(&$x)
    };
    (Int, $x:expr, $op:ident) => {
        $op.input(&$x)
    };
    (Bool, $x:expr, $op:ident) => {
        $op.input(&$x)
    };
    (Quant, $x:expr, $op:ident) => {
        $op.input(&$x)
    };
    (OptFloat, $x:expr, $op:ident) => {
        if let Some(t) = &$x {
            $op.input(t)
        }
    };
    (OptBool, $x:expr, $op:ident) => {
        if let Some(t) = &$x {
            $op.input(t)
        }
    };
    (VecFloat, $x:expr, $op:ident) => {
        for t in &$x {
            $op.input(t)
        }
    };
    (VecInt, $x:expr, $op:ident) => {
        for t in &$x {
            $op.input(t)
        }
    };
    (VecBool, $x:expr, $op:ident) => {
        for t in &$x {
            $op.input(t)
        }
    };
    (VecQuant, $x:expr, $op:ident) => {
        for t in &$x {
            $op.input(t)
        }
    };
    (Prim, $x:expr, $op:ident) => {
        match &$x {
            ::burn_backend::TensorPrimitive::Float(t) => $op.input(t),
            ::burn_backend::TensorPrimitive::QFloat(t) => $op.input(t),
        }
    };
    (QParams, $x:expr, $op:ident) => {
        $op.input(&$x.scales)
    };
    // What decides the size of a created tensor, so that its estimate is learned per size, and
    // so that an op creating a tensor from nothing is sized from its shape and dtype before it
    // runs the first time.
    ({Shape}, $x:expr, $op:ident) => {{
        $op.hint(&$x.num_elements());
        $op.created_elements($x.num_elements() as u64)
    }};
    ({Range<i64>}, $x:expr, $op:ident) => {{
        $op.hint(&(&$x.start, &$x.end));
        // An upper bound for a stepped range.
        $op.created_elements($x.end.saturating_sub($x.start).max(0) as u64)
    }};
    ({TensorData}, $x:expr, $op:ident) => {{
        $op.hint(&$x.bytes.len());
        $op.created_bytes($x.bytes.len() as u64)
    }};
    ({FloatDType}, $x:expr, $op:ident) => {{
        $op.hint(&$x);
        $op.created_dtype(::burn_backend::DType::from($x))
    }};
    ({IntDType}, $x:expr, $op:ident) => {{
        $op.hint(&$x);
        $op.created_dtype(::burn_backend::DType::from($x))
    }};
    ({BoolDType}, $x:expr, $op:ident) => {{
        $op.hint(&$x);
        $op.created_dtype(::burn_backend::DType::from($x))
    }};
    // Ops that create tensors have no input to tell the device; their device argument does.
    ({&B::Device}, $x:expr, $op:ident) => {
        $op.device($x)
    };
    ({$($ty:tt)*}, $x:expr, $op:ident) => {
        ()
    };
}

/// Turns an argument of a kind into what `B`'s method takes.
macro_rules! spill_unwrap {
    (Float, $x:expr, $op:ident) => {
        $op.take_float($x)
    };
    (Int, $x:expr, $op:ident) => {
        $op.take_int($x)
    };
    (Bool, $x:expr, $op:ident) => {
        $op.take_bool($x)
    };
    (Quant, $x:expr, $op:ident) => {
        $op.take_quantized($x)
    };
    (OptFloat, $x:expr, $op:ident) => {
        $x.map(|t| $op.take_float(t))
    };
    (OptBool, $x:expr, $op:ident) => {
        $x.map(|t| $op.take_bool(t))
    };
    (VecFloat, $x:expr, $op:ident) => {
        $x.into_iter().map(|t| $op.take_float(t)).collect()
    };
    (VecInt, $x:expr, $op:ident) => {
        $x.into_iter().map(|t| $op.take_int(t)).collect()
    };
    (VecBool, $x:expr, $op:ident) => {
        $x.into_iter().map(|t| $op.take_bool(t)).collect()
    };
    (VecQuant, $x:expr, $op:ident) => {
        $x.into_iter().map(|t| $op.take_quantized(t)).collect()
    };
    (Prim, $x:expr, $op:ident) => {
        match $x {
            ::burn_backend::TensorPrimitive::Float(t) => {
                ::burn_backend::TensorPrimitive::Float($op.take_float(t))
            }
            ::burn_backend::TensorPrimitive::QFloat(t) => {
                ::burn_backend::TensorPrimitive::QFloat($op.take_quantized(t))
            }
        }
    };
    (QParams, $x:expr, $op:ident) => {
        ::burn_backend::tensor::quantization::QuantizationParametersPrimitive::<B> {
            scales: $op.take_float($x.scales),
        }
    };
    ({$($ty:tt)*}, $x:expr, $op:ident) => {
        $x
    };
}

/// Wraps what `B`'s method returned into `SpillBackend<B>`'s result of a kind.
macro_rules! spill_wrap {
    (Float, $x:expr, $op:ident) => {
        $op.output($crate::SpillTensor::<B>::from_float($x))
    };
    (Int, $x:expr, $op:ident) => {
        $op.output($crate::SpillTensor::<B>::from_int($x))
    };
    (Bool, $x:expr, $op:ident) => {
        $op.output($crate::SpillTensor::<B>::from_bool($x))
    };
    (Quant, $x:expr, $op:ident) => {
        $op.output($crate::SpillTensor::<B>::from_quantized($x))
    };
    (Prim, $x:expr, $op:ident) => {
        match $x {
            ::burn_backend::TensorPrimitive::Float(f) => ::burn_backend::TensorPrimitive::Float(
                $op.output($crate::SpillTensor::<B>::from_float(f)),
            ),
            ::burn_backend::TensorPrimitive::QFloat(q) => ::burn_backend::TensorPrimitive::QFloat(
                $op.output($crate::SpillTensor::<B>::from_quantized(q)),
            ),
        }
    };
    (($k0:tt, $k1:tt), $x:expr, $op:ident) => {{
        let (a, b) = $x;
        (
            $crate::backend::forward::spill_wrap!($k0, a, $op),
            $crate::backend::forward::spill_wrap!($k1, b, $op),
        )
    }};
    (MaxPool1dWithIndices, $x:expr, $op:ident) => {{
        let out = $x;
        ::burn_backend::ops::MaxPool1dWithIndices::<$crate::SpillBackend<B>> {
            output: $op.output($crate::SpillTensor::<B>::from_float(out.output)),
            indices: $op.output($crate::SpillTensor::<B>::from_int(out.indices)),
        }
    }};
    (MaxPool2dWithIndices, $x:expr, $op:ident) => {{
        let out = $x;
        ::burn_backend::ops::MaxPool2dWithIndices::<$crate::SpillBackend<B>> {
            output: $op.output($crate::SpillTensor::<B>::from_float(out.output)),
            indices: $op.output($crate::SpillTensor::<B>::from_int(out.indices)),
        }
    }};
    (MaxPool1dBackward, $x:expr, $op:ident) => {
        ::burn_backend::ops::MaxPool1dBackward::<$crate::SpillBackend<B>> {
            x_grad: $op.output($crate::SpillTensor::<B>::from_float($x.x_grad)),
        }
    };
    (MaxPool2dBackward, $x:expr, $op:ident) => {
        ::burn_backend::ops::MaxPool2dBackward::<$crate::SpillBackend<B>> {
            x_grad: $op.output($crate::SpillTensor::<B>::from_float($x.x_grad)),
        }
    };
    (DeformConv2dBackward, $x:expr, $op:ident) => {{
        let out = $x;
        ::burn_backend::ops::DeformConv2dBackward::<$crate::SpillBackend<B>> {
            x_grad: $op.output($crate::SpillTensor::<B>::from_float(out.x_grad)),
            offset_grad: $op.output($crate::SpillTensor::<B>::from_float(out.offset_grad)),
            weight_grad: $op.output($crate::SpillTensor::<B>::from_float(out.weight_grad)),
            mask_grad: out
                .mask_grad
                .map(|t| $op.output($crate::SpillTensor::<B>::from_float(t))),
            bias_grad: out
                .bias_grad
                .map(|t| $op.output($crate::SpillTensor::<B>::from_float(t))),
        }
    }};
    ({$($ty:tt)*}, $x:expr, $op:ident) => {
        $x
    };
}

/// What a recipe keeps of an argument of a kind: a clone of a non-tensor argument; nothing
/// for a tensor (the scope notes its handle).
macro_rules! spill_keep {
    (Float, $x:expr) => {
        ()
    };
    (Bool, $x:expr) => {
        ()
    };
    ({$($ty:tt)*}, $x:expr) => {
        ::core::clone::Clone::clone(&$x)
    };
}

/// An argument of a kind when a recipe runs its op again: the next input primitive for a
/// tensor, the kept clone otherwise.
macro_rules! spill_replay {
    (Float, $x:expr, $args:ident) => {
        $args.float()
    };
    (Bool, $x:expr, $args:ident) => {
        $args.bool()
    };
    ({$($ty:tt)*}, $x:expr, $args:ident) => {
        $x
    };
}

/// A recomputable op's result as a primitive of any kind.
macro_rules! spill_primitive {
    (Float, $x:expr) => {
        $crate::backend::tensor::Primitive::Float($x)
    };
    (Bool, $x:expr) => {
        $crate::backend::tensor::Primitive::Bool($x)
    };
}

/// Tells the op scope the output size of an op that can outgrow its inputs, from their shapes,
/// before they are noted (see `output_size.rs`), when its first input's device has a budget;
/// nothing for the other ops.
macro_rules! spill_output_size {
    (float_matmul, $op:ident; $lhs:ident, $rhs:ident) => {
        $op.known_output(&$lhs, || $crate::backend::output_size::matmul(
            $lhs.shape_dims(),
            $lhs.bytes(),
            $rhs.shape_dims(),
            $rhs.bytes(),
        ))
    };
    (linear, $op:ident; $x:ident, $weight:ident, $bias:ident) => {
        $op.known_output(&$x, || $crate::backend::output_size::linear(
            $x.shape_dims(),
            $x.bytes(),
            $weight.shape_dims(),
        ))
    };
    (linear_x_backward, $op:ident; $weight:ident, $grad:ident) => {
        $op.known_output(&$weight, || $crate::backend::output_size::linear_x_backward(
            $weight.shape_dims(),
            $grad.shape_dims(),
            $grad.bytes(),
        ))
    };
    (linear_weight_backward, $op:ident; $x:ident, $grad:ident) => {
        $op.known_output(&$x, || $crate::backend::output_size::linear_weight_backward(
            $x.shape_dims(),
            $x.bytes(),
            $grad.shape_dims(),
        ))
    };
    (embedding, $op:ident; $weights:ident, $indices:ident) => {
        $op.known_output(&$weights, || $crate::backend::output_size::embedding(
            $weights.shape_dims(),
            $weights.bytes(),
            $indices.shape_dims(),
        ))
    };
    (conv1d, $op:ident; $x:ident, $weight:ident, $bias:ident, $options:ident) => {
        $crate::backend::forward::spill_output_size!(@conv $op; $x, $weight, $options)
    };
    (conv2d, $op:ident; $x:ident, $weight:ident, $bias:ident, $options:ident) => {
        $crate::backend::forward::spill_output_size!(@conv $op; $x, $weight, $options)
    };
    (conv3d, $op:ident; $x:ident, $weight:ident, $bias:ident, $options:ident) => {
        $crate::backend::forward::spill_output_size!(@conv $op; $x, $weight, $options)
    };
    (conv_transpose1d, $op:ident; $x:ident, $weight:ident, $bias:ident, $options:ident) => {
        $crate::backend::forward::spill_output_size!(@transpose $op; $x, $weight, $options)
    };
    (conv_transpose2d, $op:ident; $x:ident, $weight:ident, $bias:ident, $options:ident) => {
        $crate::backend::forward::spill_output_size!(@transpose $op; $x, $weight, $options)
    };
    (conv_transpose3d, $op:ident; $x:ident, $weight:ident, $bias:ident, $options:ident) => {
        $crate::backend::forward::spill_output_size!(@transpose $op; $x, $weight, $options)
    };
    (@conv $op:ident; $x:ident, $weight:ident, $options:ident) => {
        $op.known_output(&$x, || $crate::backend::output_size::conv(
            $x.shape_dims(),
            $x.bytes(),
            $weight.shape_dims(),
            &$options.stride,
            &$options.padding,
            &$options.dilation,
        ))
    };
    (@transpose $op:ident; $x:ident, $weight:ident, $options:ident) => {
        $op.known_output(&$x, || $crate::backend::output_size::conv_transpose(
            $x.shape_dims(),
            $x.bytes(),
            $weight.shape_dims(),
            &$options.stride,
            &$options.padding,
            &$options.padding_out,
            &$options.dilation,
            $options.groups,
        ))
    };
    ($other:ident, $op:ident; $($arg:ident),*) => {
        ()
    };
}

/// The body of one forwarding method. A row marked `#[recompute]` (a pure op: its output is a
/// function of its arguments alone) also gives its output a recipe that runs `B`'s same
/// kernel again, when the device may drop victims (see `recipe.rs`).
macro_rules! forward_body {
    ([] $ops:ident; $name:ident; ( $( $arg:ident : $kind:tt ),* ) -> $out:tt) => {{
        let mut op = $crate::backend::op_scope::OpScope::<B>::new(stringify!($name));
        $crate::backend::forward::spill_output_size!($name, op; $( $arg ),*);
        $( $crate::backend::forward::spill_note!($kind, $arg, op); )*
        op.begin();
        $( let $arg = $crate::backend::forward::spill_unwrap!($kind, $arg, op); )*
        // On lazy backends no worker may touch a primitive while `B` registers the op.
        let exclusive = op.exclusive();
        let result = <B as $ops<B>>::$name( $( $arg ),* );
        drop(exclusive);
        let out = $crate::backend::forward::spill_wrap!($out, result, op);
        // `op` drops where it lies once `out` is made: `drop(op)` would copy its 720 bytes.
        out
    }};
    ([recompute] $ops:ident; $name:ident; ( $( $arg:ident : $kind:tt ),* ) -> $out:tt) => {{
        let mut op = $crate::backend::op_scope::OpScope::<B>::recomputable(stringify!($name));
        $( $crate::backend::forward::spill_note!($kind, $arg, op); )*
        op.begin();
        $( let $arg = $crate::backend::forward::spill_unwrap!($kind, $arg, op); )*
        #[allow(clippy::let_unit_value, clippy::unused_unit)]
        let kept = op
            .keeps_recipe()
            .then(|| ( $( $crate::backend::forward::spill_keep!($kind, $arg), )* ));
        let exclusive = op.exclusive();
        let started = op.times_recipe().then(::std::time::Instant::now);
        let result = <B as $ops<B>>::$name( $( $arg ),* );
        let took = started.map_or(::std::time::Duration::ZERO, |s| s.elapsed());
        drop(exclusive);
        let out = $crate::backend::forward::spill_wrap!($out, result, op);
        if let Some(kept) = kept {
            op.recipe(&out, took, move |args: &mut $crate::backend::recipe::RecipeArgs<B>| {
                #[allow(clippy::let_unit_value, unused_variables)]
                let ( $( $arg, )* ) = ::core::clone::Clone::clone(&kept);
                $( let $arg = $crate::backend::forward::spill_replay!($kind, $arg, args); )*
                $crate::backend::forward::spill_primitive!(
                    $out,
                    <B as $ops<B>>::$name( $( $arg ),* )
                )
            });
        }
        // `op` drops where it lies once `out` is made: `drop(op)` would copy its 720 bytes.
        out
    }};
}

/// Generates forwarding methods for the rows of one ops trait (see the module docs).
macro_rules! forward_ops {
    ($ops:ident; $( $(#[$mark:ident])? fn $name:ident ( $( $arg:ident : $kind:tt ),* $(,)? ) -> $out:tt ; )*) => {
        $(
            fn $name( $( $arg : $crate::backend::forward::spill_ty!($kind) ),* )
                -> $crate::backend::forward::spill_ty!($out)
            {
                $crate::backend::forward::forward_body!(
                    [$($mark)?] $ops; $name; ( $( $arg : $kind ),* ) -> $out
                )
            }
        )*
    };
}

pub(crate) use {
    forward_body, forward_ops, spill_keep, spill_note, spill_output_size, spill_primitive,
    spill_replay, spill_ty, spill_unwrap, spill_wrap,
};
