//! Output sizes, from the inputs' shapes, of the ops whose output can be larger than every
//! input: matrix products, linear layers, embedding lookups and convolutions.
//!
//! The engine makes room for an op's output before the op runs, and learns each op's output
//! size (per op and input sizes) from its first run. Until then it takes the largest input
//! as the estimate, which these ops outgrow (a `[64, 1] x [1, 64]` product is 64 times its
//! inputs), so that their first run would hold more than the budget until the eviction after
//! it. A limit the user sets is a limit: these ops say their output size before they run.
//! Each function returns `None` when the shapes are not what the op takes (the op then reports
//! the error itself) or an input is empty.

/// Bytes per element of a tensor of `dims` holding `bytes`.
fn element_bytes(dims: &[usize], bytes: u64) -> Option<u64> {
    let elements = elements(dims)?;
    (elements > 0).then(|| bytes / elements)
}

fn elements(dims: &[usize]) -> Option<u64> {
    dims.iter()
        .try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))
}

/// `lhs x rhs` of the same rank `D >= 2`: the batch dimensions broadcast, then
/// `[.., m, k] x [.., k, n] -> [.., m, n]`, in the wider of the two element types.
pub(crate) fn matmul(lhs: &[usize], lhs_bytes: u64, rhs: &[usize], rhs_bytes: u64) -> Option<u64> {
    let rank = lhs.len();
    if rank < 2 || rhs.len() != rank {
        return None;
    }
    let batch = lhs[..rank - 2]
        .iter()
        .zip(&rhs[..rank - 2])
        .try_fold(1u64, |n, (&l, &r)| n.checked_mul(l.max(r) as u64))?;
    let element = element_bytes(lhs, lhs_bytes)?.max(element_bytes(rhs, rhs_bytes)?);
    batch
        .checked_mul(lhs[rank - 2] as u64)?
        .checked_mul(rhs[rank - 1] as u64)?
        .checked_mul(element)
}

/// `linear(x, weight, bias)`: `x [.., d_input]`, `weight [d_input, d_output]` ->
/// `[.., d_output]`, in `x`'s element type.
pub(crate) fn linear(x: &[usize], x_bytes: u64, weight: &[usize]) -> Option<u64> {
    let [_, d_output] = weight else {
        return None;
    };
    last_dim_replaced(x, x_bytes, *d_output)
}

/// The gradient of `linear`'s input: `weight [d_input, d_output]`, `output_grad
/// [.., d_output]` -> `[.., d_input]`, in the gradient's element type.
pub(crate) fn linear_x_backward(weight: &[usize], grad: &[usize], grad_bytes: u64) -> Option<u64> {
    let [d_input, _] = weight else {
        return None;
    };
    last_dim_replaced(grad, grad_bytes, *d_input)
}

/// A tensor of `dims` holding `bytes`, with its last dimension made `last`.
fn last_dim_replaced(dims: &[usize], bytes: u64, last: usize) -> Option<u64> {
    let (_, batch) = dims.split_last()?;
    let element = element_bytes(dims, bytes)?;
    elements(batch)?
        .checked_mul(last as u64)?
        .checked_mul(element)
}

/// The gradient of `linear`'s weight: `x [.., d_input]`, `output_grad [.., d_output]` ->
/// `[d_input, d_output]`, in `x`'s element type.
pub(crate) fn linear_weight_backward(x: &[usize], x_bytes: u64, grad: &[usize]) -> Option<u64> {
    let element = element_bytes(x, x_bytes)?;
    elements(&[*x.last()?, *grad.last()?])?.checked_mul(element)
}

/// `embedding(weights, indices)`: `weights [n, d_model]`, `indices [..]` ->
/// `[.., d_model]`, in the weights' element type.
pub(crate) fn embedding(weights: &[usize], weights_bytes: u64, indices: &[usize]) -> Option<u64> {
    let [_, d_model] = weights else {
        return None;
    };
    let element = element_bytes(weights, weights_bytes)?;
    elements(indices)?
        .checked_mul(*d_model as u64)?
        .checked_mul(element)
}

/// A convolution's output: `x [batch, channels_in, size..]`, `weight [channels_out,
/// channels_in / groups, kernel..]` -> `[batch, channels_out, out..]`, each `out` as Burn's
/// `calculate_conv_output_size` gives it, in `x`'s element type.
pub(crate) fn conv(
    x: &[usize],
    x_bytes: u64,
    weight: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
) -> Option<u64> {
    let ([batch, _, size @ ..], [channels_out, _, kernel @ ..]) = (x, weight) else {
        return None;
    };
    (kernel.len() == size.len()).then_some(())?;
    let mut elements = (*batch as u64).checked_mul(*channels_out as u64)?;
    for (i, (&size, &kernel)) in size.iter().zip(kernel).enumerate() {
        let span = dilation.get(i)?.checked_mul(kernel.checked_sub(1)?)? + 1;
        let padded = size.checked_add(padding.get(i)?.checked_mul(2)?)?;
        let out = padded.checked_sub(span)? / stride.get(i).copied().filter(|&s| s > 0)? + 1;
        elements = elements.checked_mul(out as u64)?;
    }
    elements.checked_mul(element_bytes(x, x_bytes)?)
}

/// A transposed convolution's output: `x [batch, channels_in, size..]`, `weight [channels_in,
/// channels_out / groups, kernel..]` -> `[batch, channels_out, out..]`, each `out` as Burn's
/// `calculate_conv_transpose_output_size` gives it, in `x`'s element type.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_transpose(
    x: &[usize],
    x_bytes: u64,
    weight: &[usize],
    stride: &[usize],
    padding: &[usize],
    padding_out: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Option<u64> {
    let ([batch, _, size @ ..], [_, channels_per_group, kernel @ ..]) = (x, weight) else {
        return None;
    };
    (kernel.len() == size.len()).then_some(())?;
    let channels_out = channels_per_group.checked_mul(groups)?;
    let mut elements = (*batch as u64).checked_mul(channels_out as u64)?;
    for (i, (&size, &kernel)) in size.iter().zip(kernel).enumerate() {
        let span = dilation.get(i)?.checked_mul(kernel.checked_sub(1)?)? + 1;
        let grown = size
            .checked_sub(1)?
            .checked_mul(*stride.get(i)?)?
            .checked_add(span)?
            .checked_add(*padding_out.get(i)?)?;
        let out = grown.checked_sub(padding.get(i)?.checked_mul(2)?)?;
        elements = elements.checked_mul(out as u64)?;
    }
    elements.checked_mul(element_bytes(x, x_bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matrix_product_is_sized_from_both_shapes_with_broadcast_batches() {
        // An outer product: 64 times each input.
        assert_eq!(matmul(&[64, 1], 256, &[1, 64], 256), Some(64 * 64 * 4));
        assert_eq!(
            matmul(
                &[2, 1, 8, 16],
                2 * 8 * 16 * 4,
                &[1, 3, 16, 32],
                3 * 16 * 32 * 4
            ),
            Some(2 * 3 * 8 * 32 * 4)
        );
        // f16 times f32: sized in the wider type.
        assert_eq!(matmul(&[4, 4], 32, &[4, 4], 64), Some(64));
        assert_eq!(matmul(&[4], 16, &[4], 16), None, "rank 1");
        assert_eq!(matmul(&[4, 4], 64, &[2, 4, 4], 128), None, "ranks differ");
        assert_eq!(matmul(&[0, 4], 0, &[4, 4], 64), None, "an empty input");
    }

    #[test]
    fn linear_layers_and_their_gradients_are_sized_from_the_weight() {
        // x [2, 3, 8], weight [8, 64] -> [2, 3, 64].
        assert_eq!(
            linear(&[2, 3, 8], 2 * 3 * 8 * 4, &[8, 64]),
            Some(2 * 3 * 64 * 4)
        );
        assert_eq!(linear(&[2, 8], 64, &[8, 64, 1]), None, "a weight of rank 3");
        // output_grad [2, 3, 64], weight [8, 64] -> [2, 3, 8].
        assert_eq!(
            linear_x_backward(&[8, 64], &[2, 3, 64], 2 * 3 * 64 * 4),
            Some(2 * 3 * 8 * 4)
        );
        // x [2, 3, 8], output_grad [2, 3, 64] -> [8, 64].
        assert_eq!(
            linear_weight_backward(&[2, 3, 8], 2 * 3 * 8 * 4, &[2, 3, 64]),
            Some(8 * 64 * 4)
        );
    }

    #[test]
    fn convolutions_are_sized_as_burn_sizes_them() {
        // ResNet's stem: [2, 3, 224, 224], 64 filters of 7x7, stride 2, padding 3 ->
        // [2, 64, 112, 112], 21 times its input.
        let x = [2, 3, 224, 224];
        let x_bytes = 2 * 3 * 224 * 224 * 4;
        let stem = conv(&x, x_bytes, &[64, 3, 7, 7], &[2, 2], &[3, 3], &[1, 1]);
        assert_eq!(stem, Some(2 * 64 * 112 * 112 * 4));
        // 1-d, dilated: [1, 4, 100], kernel 3, dilation 2, no padding -> [1, 8, 96].
        let dilated = conv(&[1, 4, 100], 1600, &[8, 4, 3], &[1], &[0], &[2]);
        assert_eq!(dilated, Some(8 * 96 * 4));
        // A kernel wider than the padded input, or a zero stride: the op reports it.
        assert_eq!(
            conv(&[1, 1, 2, 2], 16, &[1, 1, 5, 5], &[1, 1], &[0, 0], &[1, 1]),
            None
        );
        assert_eq!(
            conv(&[1, 1, 8, 8], 256, &[1, 1, 3, 3], &[0, 0], &[1, 1], &[1, 1]),
            None
        );
        assert_eq!(
            conv(&[1, 1, 8, 8], 256, &[1, 1, 3], &[1, 1], &[1, 1], &[1, 1]),
            None
        );
        // Transposed, doubling: [1, 16, 8, 8], weight [16, 4, 4, 4] in 2 groups, stride 2,
        // padding 1 -> [1, 8, 16, 16].
        let up = conv_transpose(
            &[1, 16, 8, 8],
            16 * 8 * 8 * 4,
            &[16, 4, 4, 4],
            &[2, 2],
            &[1, 1],
            &[0, 0],
            &[1, 1],
            2,
        );
        assert_eq!(up, Some(8 * 16 * 16 * 4));
    }

    #[test]
    fn an_embedding_lookup_is_sized_from_the_indices_and_the_width() {
        // weights [100, 32] (bf16), indices [4, 16] -> [4, 16, 32].
        assert_eq!(
            embedding(&[100, 32], 100 * 32 * 2, &[4, 16]),
            Some(4 * 16 * 32 * 2)
        );
        assert_eq!(embedding(&[100], 400, &[4]), None);
    }
}
