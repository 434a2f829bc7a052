//! Module ops (conv, pool, interpolate, attention, fft, ...): all forwarded so `B`'s kernels run, never Burn's decompositions.

use burn_backend::Backend;
use burn_backend::ops::*;

use crate::SpillBackend;
use crate::backend::forward::forward_ops;

impl<B: Backend> ModuleOps<Self> for SpillBackend<B> {
    forward_ops! { ModuleOps;
        fn embedding(weights: Float, indices: Int) -> Float;
        fn embedding_backward(weights: Float, output_grad: Float, indices: Int) -> Float;
        fn linear(x: Float, weight: Float, bias: OptFloat) -> Float;
        fn linear_x_backward(weight: Float, output_grad: Float) -> Float;
        fn linear_weight_backward(x: Float, output_grad: Float) -> Float;
        fn linear_bias_backward(output_grad: Float) -> Float;
        fn conv1d(x: Float, weight: Float, bias: OptFloat, options: {ConvOptions<1>}) -> Float;
        fn conv1d_x_backward(x: Float, weight: Float, output_grad: Float, options: {ConvOptions<1>}) -> Float;
        fn conv1d_weight_backward(x: Float, weight: Float, output_grad: Float, options: {ConvOptions<1>}) -> Float;
        fn conv1d_bias_backward(x: Float, bias: Float, output_grad: Float) -> Float;
        fn conv2d(x: Float, weight: Float, bias: OptFloat, options: {ConvOptions<2>}) -> Float;
        fn conv2d_x_backward(x: Float, weight: Float, output_grad: Float, options: {ConvOptions<2>}) -> Float;
        fn conv2d_weight_backward(x: Float, weight: Float, output_grad: Float, options: {ConvOptions<2>}) -> Float;
        fn conv2d_bias_backward(x: Float, bias: Float, output_grad: Float) -> Float;
        fn deform_conv2d(x: Float, offset: Float, weight: Float, mask: OptFloat, bias: OptFloat, options: {DeformConvOptions<2>}) -> Float;
        fn deform_conv2d_backward(x: Float, offset: Float, weight: Float, mask: OptFloat, bias: OptFloat, output_grad: Float, options: {DeformConvOptions<2>}) -> DeformConv2dBackward;
        fn conv3d(x: Float, weight: Float, bias: OptFloat, options: {ConvOptions<3>}) -> Float;
        fn conv3d_x_backward(x: Float, weight: Float, output_grad: Float, options: {ConvOptions<3>}) -> Float;
        fn conv3d_weight_backward(x: Float, weight: Float, output_grad: Float, options: {ConvOptions<3>}) -> Float;
        fn conv3d_bias_backward(x: Float, bias: Float, output_grad: Float) -> Float;
        fn conv_transpose1d(x: Float, weight: Float, bias: OptFloat, options: {ConvTransposeOptions<1>}) -> Float;
        fn conv_transpose1d_x_backward(weight: Float, output_grad: Float, options: {ConvTransposeOptions<1>}) -> Float;
        fn conv_transpose1d_weight_backward(x: Float, weight: Float, output_grad: Float, options: {ConvTransposeOptions<1>}) -> Float;
        fn conv_transpose1d_bias_backward(x: Float, bias: Float, output_grad: Float) -> Float;
        fn conv_transpose2d(x: Float, weight: Float, bias: OptFloat, options: {ConvTransposeOptions<2>}) -> Float;
        fn conv_transpose2d_x_backward(weight: Float, output_grad: Float, options: {ConvTransposeOptions<2>}) -> Float;
        fn conv_transpose2d_weight_backward(x: Float, weight: Float, output_grad: Float, options: {ConvTransposeOptions<2>}) -> Float;
        fn conv_transpose2d_bias_backward(x: Float, bias: Float, output_grad: Float) -> Float;
        fn conv_transpose3d(x: Float, weight: Float, bias: OptFloat, options: {ConvTransposeOptions<3>}) -> Float;
        fn conv_transpose3d_x_backward(weight: Float, output_grad: Float, options: {ConvTransposeOptions<3>}) -> Float;
        fn conv_transpose3d_weight_backward(x: Float, weight: Float, output_grad: Float, options: {ConvTransposeOptions<3>}) -> Float;
        fn conv_transpose3d_bias_backward(x: Float, bias: Float, output_grad: Float) -> Float;
        fn unfold4d(x: Float, kernel_size: {[usize; 2]}, options: {UnfoldOptions}) -> Float;
        fn avg_pool1d(x: Float, kernel_size: {usize}, stride: {usize}, padding: {usize}, count_include_pad: {bool}, ceil_mode: {bool}) -> Float;
        fn avg_pool1d_backward(x: Float, grad: Float, kernel_size: {usize}, stride: {usize}, padding: {usize}, count_include_pad: {bool}, ceil_mode: {bool}) -> Float;
        fn avg_pool2d(x: Float, kernel_size: {[usize; 2]}, stride: {[usize; 2]}, padding: {[usize; 2]}, count_include_pad: {bool}, ceil_mode: {bool}) -> Float;
        fn avg_pool2d_backward(x: Float, grad: Float, kernel_size: {[usize; 2]}, stride: {[usize; 2]}, padding: {[usize; 2]}, count_include_pad: {bool}, ceil_mode: {bool}) -> Float;
        fn adaptive_avg_pool2d(x: Float, output_size: {[usize; 2]}) -> Float;
        fn adaptive_avg_pool2d_backward(x: Float, grad: Float) -> Float;
        fn adaptive_avg_pool1d(x: Float, output_size: {usize}) -> Float;
        fn adaptive_avg_pool1d_backward(x: Float, grad: Float) -> Float;
        fn max_pool1d(x: Float, kernel_size: {usize}, stride: {usize}, padding: {usize}, dilation: {usize}, ceil_mode: {bool}) -> Float;
        fn max_pool1d_with_indices(x: Float, kernel_size: {usize}, stride: {usize}, padding: {usize}, dilation: {usize}, ceil_mode: {bool}) -> MaxPool1dWithIndices;
        fn max_pool1d_with_indices_backward(x: Float, kernel_size: {usize}, stride: {usize}, padding: {usize}, dilation: {usize}, ceil_mode: {bool}, output_grad: Float, indices: Int) -> MaxPool1dBackward;
        fn max_pool2d(x: Float, kernel_size: {[usize; 2]}, stride: {[usize; 2]}, padding: {[usize; 2]}, dilation: {[usize; 2]}, ceil_mode: {bool}) -> Float;
        fn max_pool2d_with_indices(x: Float, kernel_size: {[usize; 2]}, stride: {[usize; 2]}, padding: {[usize; 2]}, dilation: {[usize; 2]}, ceil_mode: {bool}) -> MaxPool2dWithIndices;
        fn max_pool2d_with_indices_backward(x: Float, kernel_size: {[usize; 2]}, stride: {[usize; 2]}, padding: {[usize; 2]}, dilation: {[usize; 2]}, ceil_mode: {bool}, output_grad: Float, indices: Int) -> MaxPool2dBackward;
        fn interpolate(x: Float, output_size: {[usize; 2]}, options: {InterpolateOptions}) -> Float;
        fn interpolate_backward(x: Float, grad: Float, output_size: {[usize; 2]}, options: {InterpolateOptions}) -> Float;
        fn attention(query: Float, key: Float, value: Float, mask: OptBool, attn_bias: OptFloat, options: {AttentionModuleOptions}) -> Float;
        fn layer_norm(tensor: Float, gamma: Float, beta: OptFloat, epsilon: {f64}) -> Float;
        fn ctc_loss(log_probs: Float, targets: Int, input_lengths: Int, target_lengths: Int, blank: {usize}) -> Float;
        fn has_ctc_loss_backward() -> {bool};
        fn ctc_loss_backward(log_probs: Float, targets: Int, input_lengths: Int, target_lengths: Int, grad_loss: Float, blank: {usize}) -> Float;
        fn rfft(signal: Float, dim: {usize}, n: {Option<usize>}) -> (Float, Float);
        fn irfft(spectrum_re: Float, spectrum_im: Float, dim: {usize}, n: {Option<usize>}) -> Float;
    }
}
