"""Depthwise 2-D convolution (group == C, any channel multiplier) as a direct stencil on NCHW.

As an implicit GEMM a depthwise conv has K = KH*KW and one output channel per group, so a
tensor-core tile would be mostly padding. Here a program owns BLOCK_P output pixels x BLOCK_C
channels and accumulates the KH*KW taps with fp32 multiply-adds; output channel oc reads input
channel oc // (OC / C); an NHWC task's buffers are read through permuted strides. Epilogue in
partition.py's conv order: act(conv + bias + residual).
"""
import math

import triton
import triton.language as tl

# include: activation
# include: conv_nchw

KIND = "conv2d"
PRECISION = "fp32"
SPACE = {"BLOCK_P": [16, 32, 64, 128, 256], "BLOCK_C": [1, 2, 4, 8, 16, 32], "num_warps": [1, 2, 4, 8]}
DEFAULT = {"BLOCK_P": 64, "BLOCK_C": 8, "num_warps": 4}
VALUES_PER_THREAD = 64  # fp32 accumulator values a thread holds


def constraints(task, config, target):
    channels, group = _nchw_shape(task, task.inputs[0].shape)[1], int(task.attr("group", 1))
    if group != channels:
        return f"not depthwise: group {group} != {channels} input channels"
    if problem := _residual_problem(task) or _unscaled_input_problem(task):
        return problem
    threads = config["num_warps"] * target.profile.warp_size
    if config["BLOCK_P"] * config["BLOCK_C"] > VALUES_PER_THREAD * threads:
        return f"a {config['BLOCK_P']}x{config['BLOCK_C']} accumulator spills over {threads} threads"
    return None


def shared_memory(task, config):
    return 0  # taps stream from global memory into registers


@triton.jit
def _conv2d_depthwise(x_ptr, w_ptr, o_ptr, bias_ptr, res_ptr, OC, MULTIPLIER, H, W, OH, OW, P, KH, KW,
                      stride_h, stride_w, pad_t, pad_l, dil_h, dil_w,
                      sx_n, sx_c, sx_h, sx_w, sw_o, sw_h, sw_w, so_n, so_c, so_h, so_w,
                      sr_n, sr_c, sr_h, sr_w, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                      ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    pixels = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    oc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    pixel_ok = pixels < P
    channel_ok = oc < OC
    n = pixels // (OH * OW)
    oh = (pixels // OW) % OH
    ow = pixels % OW
    x_base = x_ptr + n[:, None].to(tl.int64) * sx_n + (oc // MULTIPLIER)[None, :] * sx_c
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for kh in range(KH):
        ih = oh * stride_h - pad_t + kh * dil_h
        for kw in range(KW):
            iw = ow * stride_w - pad_l + kw * dil_w
            inside = pixel_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            x = tl.load(x_base + (ih * sx_h + iw * sx_w)[:, None], mask=inside[:, None] & channel_ok[None, :],
                        other=0.0)
            w = tl.load(w_ptr + oc * sw_o + kh * sw_h + kw * sw_w, mask=channel_ok, other=0.0)
            acc += x.to(tl.float32) * w.to(tl.float32)[None, :]
    _finish_nchw(acc, n, oc, oh, ow, pixel_ok, channel_ok, bias_ptr, res_ptr, o_ptr, sr_n, sr_c, sr_h, sr_w,
                 so_n, so_c, so_h, so_w, ACTIVATION, HAS_BIAS, HAS_RESIDUAL)


def launch(task, config, inputs, outputs):
    x, w, out, has_bias, has_residual, bias, residual, residual_strides = _nchw_operands(task, inputs, outputs)
    batch, channels, height, width = x.shape
    out_channels, _, kernel_h, kernel_w = w.shape
    out_h, out_w = out.shape[2], out.shape[3]
    (stride_h, stride_w), (pad_t, pad_l), (dil_h, dil_w), _ = _conv_attrs(task)
    pixels = batch * out_h * out_w
    w_strides = w.stride()
    grid = (triton.cdiv(pixels, config["BLOCK_P"]), triton.cdiv(out_channels, config["BLOCK_C"]))
    _conv2d_depthwise[grid](x, w, out, bias, residual, out_channels, out_channels // channels, height, width,
                            out_h, out_w, pixels, kernel_h, kernel_w, stride_h, stride_w, pad_t, pad_l,
                            dil_h, dil_w, *x.stride(), w_strides[0], w_strides[2], w_strides[3], *out.stride(),
                            *residual_strides,
                            BLOCK_P=config["BLOCK_P"], BLOCK_C=config["BLOCK_C"],
                            ACTIVATION=task.attr("activation", "none"), HAS_BIAS=has_bias,
                            HAS_RESIDUAL=has_residual, num_warps=config["num_warps"])
