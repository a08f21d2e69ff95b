"""The aten ops each category of the split is made of (``categories``: eager stacks; ``inductor_kernels``: the
ops a compiled kernel is named after)."""

from __future__ import annotations

GEMM_OPS = {
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
    "aten::linear", "aten::_addmm_activation", "aten::_scaled_mm", "aten::_int_mm", "aten::einsum",
    "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
    "aten::cudnn_convolution", "aten::mkldnn_convolution", "aten::addmv", "aten::mv", "aten::dot",
    "aten::_grouped_mm", "aten::_scaled_grouped_mm",
}
NORM_OPS = {
    "aten::layer_norm", "aten::native_layer_norm", "aten::group_norm", "aten::native_group_norm",
    "aten::rms_norm", "aten::_fused_rms_norm", "aten::batch_norm", "aten::native_batch_norm",
    "aten::_batch_norm_impl_index", "aten::instance_norm", "aten::_native_batch_norm_legit",
    "aten::_native_batch_norm_legit_no_training",
}
ELEMENTWISE_OPS = {
    # arithmetic and activations
    "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "div", "div_", "neg", "pow", "sqrt", "rsqrt",
    "exp", "exp2", "log", "log2", "abs", "sign", "clamp", "clamp_", "clamp_min", "clamp_max", "minimum",
    "maximum", "addcmul", "addcmul_", "addcdiv", "lerp", "where", "gelu", "silu", "relu", "tanh",
    "sigmoid", "erf", "sin", "cos", "reciprocal", "square", "fill_", "zero_", "masked_fill",
    "masked_fill_", "eq", "ne", "lt", "gt", "le", "ge", "logical_not", "bitwise_not", "floor", "ceil",
    "round", "trunc", "fmod", "remainder", "copysign", "nan_to_num", "gelu_", "silu_", "relu_",
    # data movement: casts and copies are elementwise kernels
    "copy_", "to", "_to_copy", "clone", "contiguous", "cat", "stack", "type_as", "expand_as",
    "_unsafe_view", "reshape", "view_as_real", "view_as_complex", "polar", "complex", "flip", "roll",
    "repeat", "repeat_interleave", "index_select", "unflatten", "flatten",
}
