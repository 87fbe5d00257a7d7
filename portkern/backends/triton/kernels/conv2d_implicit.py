"""2-D convolution as an implicit GEMM on NCHW tensors: no im2col buffer, no layout change.
On an NHWC task it reads the same buffers through permuted strides (conv2d_nhwc is the variant
made for that layout; this one can still win where a tap has few channels, as a 3-channel stem).

The GEMM view is M = N*OH*OW output pixels, N = OC/group channels, K = C/group*KH*KW. A program
owns a BLOCK_M x BLOCK_N output tile of one group and gathers its A tile straight from the NCHW
input through strides (padding and dilation are masks), its B tile from the OIHW weight; launch
cannot allocate, so an NHWC copy is not an option and the gather is the price. Epilogue in
partition.py's conv order: act(conv + bias + residual). fp32 inputs use exact fp32 products.
"""
import math

import triton
import triton.language as tl

# include: activation
# include: conv_nchw

KIND = "conv2d"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "BLOCK_K": [16, 32, 64],
         "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4]}
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
ACCUMULATOR_PER_THREAD = 64  # fp32 values


def constraints(task, config, target):
    if problem := _residual_problem(task) or _unscaled_input_problem(task):
        return problem
    threads = config["num_warps"] * target.profile.warp_size
    # the gather's per-element indices take registers too: 128x128 over 4 warps spilled on an H200
    if config["BLOCK_M"] * config["BLOCK_N"] > ACCUMULATOR_PER_THREAD * threads:
        return f"a {config['BLOCK_M']}x{config['BLOCK_N']} fp32 accumulator spills over {threads} threads"
    return None


@triton.jit
def _conv2d_implicit(x_ptr, w_ptr, o_ptr, bias_ptr, res_ptr, C_G, H, W, OC_G, OH, OW, P, KH, KW,
                     stride_h, stride_w, pad_t, pad_l, dil_h, dil_w,
                     sx_n, sx_c, sx_h, sx_w, sw_o, sw_c, sw_h, sw_w, so_n, so_c, so_h, so_w,
                     sr_n, sr_c, sr_h, sr_w, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                     HAS_RESIDUAL: tl.constexpr):
    group = tl.program_id(2)
    pixels = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    channels = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # within the group
    pixel_ok = pixels < P
    channel_ok = channels < OC_G
    n = pixels // (OH * OW)
    oh = (pixels // OW) % OH
    ow = pixels % OW
    oc = group * OC_G + channels
    x_base = x_ptr + n[:, None].to(tl.int64) * sx_n + (group * C_G) * sx_c
    window = KH * KW
    k_total = C_G * window
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_total, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_total
        c = ks // window
        kh = (ks % window) // KW
        kw = ks % KW
        ih = oh[:, None] * stride_h - pad_t + kh[None, :] * dil_h
        iw = ow[:, None] * stride_w - pad_l + kw[None, :] * dil_w
        inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a = tl.load(x_base + c[None, :] * sx_c + ih * sx_h + iw * sx_w,
                    mask=pixel_ok[:, None] & k_ok[None, :] & inside, other=0.0)
        b = tl.load(w_ptr + oc[None, :] * sw_o + c[:, None] * sw_c + kh[:, None] * sw_h + kw[:, None] * sw_w,
                    mask=k_ok[:, None] & channel_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    _finish_nchw(acc, n, oc, oh, ow, pixel_ok, channel_ok, bias_ptr, res_ptr, o_ptr, sr_n, sr_c, sr_h, sr_w,
                 so_n, so_c, so_h, so_w, ACTIVATION, HAS_BIAS, HAS_RESIDUAL)


def launch(task, config, inputs, outputs):
    x, w, out, has_bias, has_residual, bias, residual, residual_strides = _nchw_operands(task, inputs, outputs)
    batch, channels, height, width = x.shape
    out_channels, channels_per_group, kernel_h, kernel_w = w.shape
    out_h, out_w = out.shape[2], out.shape[3]
    (stride_h, stride_w), (pad_t, pad_l), (dil_h, dil_w), groups = _conv_attrs(task)
    pixels = batch * out_h * out_w
    oc_per_group = out_channels // groups
    grid = (triton.cdiv(pixels, config["BLOCK_M"]), triton.cdiv(oc_per_group, config["BLOCK_N"]), groups)
    _conv2d_implicit[grid](x, w, out, bias, residual, channels_per_group, height, width, oc_per_group,
                           out_h, out_w, pixels, kernel_h, kernel_w, stride_h, stride_w, pad_t, pad_l,
                           dil_h, dil_w, *x.stride(), *w.stride(), *out.stride(),
                           *residual_strides,
                           BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
                           ACTIVATION=task.attr("activation", "none"), HAS_BIAS=has_bias,
                           HAS_RESIDUAL=has_residual, num_warps=config["num_warps"],
                           num_stages=config["num_stages"])
