"""2-D convolution as an implicit GEMM on NHWC buffers (the channels-last graph of layout.py).

The GEMM view: M = N*OH*OW output pixels, N = OC/group channels, K = KH*KW*C/group in (kh, kw, c)
order. Each K step is one filter tap and BLOCK_K consecutive input channels, so the A tile is
BLOCK_M runs of contiguous channels (vector loads; the tap's row and column are computed once per
pixel, not per element as an NCHW gather must) and the B tile is BLOCK_K contiguous channels of
the OHWI weight. The taps and channel blocks are one flat loop, so Triton pipelines it
(num_stages) even where a tap has a single channel block (3x3 over 64 channels). Where a tap has
fewer channels than BLOCK_K (a 3-channel stem: 16 would be 81% padding), TAP_ROWS makes a step
BLOCK_K consecutive values of a filter row instead: NHWC stores a row's KW taps x C channels
contiguously, and so does the OHWI weight, so the row is one run (21 of 32 useful). Output tiles
go GROUP_M pixel blocks at a time across the channels (L2 reuse of the input rows). The output
of a program is BLOCK_M pixels x BLOCK_N contiguous channels: the epilogue, partition.py's conv
order act(conv + bias + residual), reads and writes whole channel runs.
"""
import math

import triton
import triton.language as tl

KIND = "conv2d"
PRECISION = "fp32"
DOT_PRECISION = "ieee"
SPACE = {"BLOCK_M": [32, 64, 128, 256], "BLOCK_N": [32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128],
         "GROUP_M": [1, 8], "num_warps": [4, 8], "num_stages": [2, 3, 4, 5], "TAP_ROWS": [False, True]}
# the best geomean over ResNet-50's b32 convs on an H200, 1.06x of each shape's best of 21 configs
# (benchmarks/results/h200-grid-conv-nhwc-2026-12-03.json)
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4,
           "TAP_ROWS": False}

# include: gemm_common
# include: conv_common


def constraints(task, config, target):
    if task.attr("layout") != "nhwc":
        return "this variant reads NHWC buffers (the channels-last graph)"
    if problem := _residual_problem(task):
        return problem
    group, block_k = int(task.attr("group", 1)), config["BLOCK_K"]
    channels, kernel_w = task.inputs[0].shape[3] // group, task.inputs[1].shape[2]
    if config["TAP_ROWS"]:
        if channels >= block_k:
            return f"a tap's {channels} channels fill BLOCK_K {block_k}: filter rows would add nothing"
        if group != 1 or tuple(task.attr("dilations", (1, 1)))[1] != 1:
            return "a filter row is one contiguous run only without groups and column dilation"
        if block_k > max(16, triton.next_power_of_2(kernel_w * channels)):
            return f"BLOCK_K {block_k} exceeds a filter row's {kernel_w * channels} values: mostly padding"
    elif block_k > max(16, triton.next_power_of_2(channels)):
        return f"BLOCK_K {block_k} exceeds the {channels} channels of one tap: mostly padding"
    return _accumulator_problem(config["BLOCK_M"], config["BLOCK_N"], config["num_warps"], target)


@triton.jit
def _conv2d_nhwc(x_ptr, w_ptr, o_ptr, bias_ptr, res_ptr, C_G, H, W, OC_G, OH, OW, P, KW,
                 stride_h, stride_w, pad_t, pad_l, dil_h, dil_w, k_steps, inner_steps,
                 sx_n, sx_h, sx_w, sw_o, so_n, so_h, so_w, sr_n, sr_h, sr_w,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                 TAP_ROWS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """inner_steps: K steps per tap, or with TAP_ROWS per filter row."""
    group = tl.program_id(1)
    block_m, block_n = _swizzle(tl.program_id(0), P, OC_G, BLOCK_M, BLOCK_N, GROUP_M)
    pixels = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    channels = block_n * BLOCK_N + tl.arange(0, BLOCK_N)  # within the group
    pixel_ok = pixels < P
    channel_ok = channels < OC_G
    n = pixels // (OH * OW)
    oh = (pixels // OW) % OH
    ow = pixels % OW
    top = oh * stride_h - pad_t
    left = ow * stride_w - pad_l
    x_rows = x_ptr + n.to(tl.int64) * sx_n + group * C_G
    oc = group * OC_G + channels
    w_cols = w_ptr + oc.to(tl.int64) * sw_o
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(k_steps):
        if TAP_ROWS:  # values j of filter row kh: tap j // C_G, channel j % C_G, at offset j
            kh = step // inner_steps
            js = (step % inner_steps) * BLOCK_K + ks
            k_ok = js < KW * C_G
            ih = top + kh * dil_h
            iw = left[:, None] + (js // C_G)[None, :]
            inside = (pixel_ok & (ih >= 0) & (ih < H))[:, None] & (iw >= 0) & (iw < W) & k_ok[None, :]
            a = tl.load((x_rows + ih * sx_h + left * sx_w)[:, None] + js[None, :], mask=inside, other=0.0)
            b = tl.load(w_cols[None, :] + (kh * KW * C_G + js)[:, None], mask=k_ok[:, None] & channel_ok[None, :],
                        other=0.0)
        else:
            tap = step // inner_steps
            cs = (step % inner_steps) * BLOCK_K + ks
            c_ok = cs < C_G
            ih = top + (tap // KW) * dil_h
            iw = left + (tap % KW) * dil_w
            inside = pixel_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a = tl.load((x_rows + ih * sx_h + iw * sx_w)[:, None] + cs[None, :],
                        mask=inside[:, None] & c_ok[None, :], other=0.0)
            b = tl.load(w_cols[None, :] + (tap * C_G + cs)[:, None], mask=c_ok[:, None] & channel_ok[None, :],
                        other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + oc, mask=channel_ok, other=0.0).to(tl.float32)[None, :]
    mask = pixel_ok[:, None] & channel_ok[None, :]
    n64 = n.to(tl.int64)
    if HAS_RESIDUAL:
        acc += tl.load(res_ptr + (n64 * sr_n + oh * sr_h + ow * sr_w)[:, None] + oc[None, :], mask=mask,
                       other=0.0).to(tl.float32)
    acc = _activate(acc, ACTIVATION)
    tl.store(o_ptr + (n64 * so_n + oh * so_h + ow * so_w)[:, None] + oc[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=mask)


def _channel_contiguous(tensor, what):
    """(batch/row, height, width) strides of a 4-D buffer whose last axis must be unit-stride."""
    strides = tensor.stride()
    if strides[3] != 1:
        raise ValueError(f"{what} must have contiguous channels (strides {strides})")
    return strides[:3]


def launch(task, config, inputs, outputs):
    x, w, out = inputs[0], inputs[1], outputs[0]
    batch, height, width, channels = x.shape
    out_channels, kernel_h, kernel_w, channels_per_group = w.shape
    out_h, out_w = out.shape[1], out.shape[2]
    (stride_h, stride_w), (pad_t, pad_l), (dil_h, dil_w), groups = _conv_attrs(task)
    has_bias, has_residual, bias, residual = _epilogue_operands(task, inputs, x)
    pixels = batch * out_h * out_w
    oc_per_group = out_channels // groups
    sx = _channel_contiguous(x, "input")
    sw_o, sw_h, sw_w = _channel_contiguous(w, "weight")
    if (sw_h, sw_w) != (kernel_w * channels_per_group, channels_per_group):
        raise ValueError(f"the OHWI weight must be contiguous within each output channel (strides {w.stride()})")
    if config["TAP_ROWS"]:
        if sx[2] != channels:
            raise ValueError(f"filter rows need pixels stored back to back (input strides {x.stride()})")
        inner_steps = triton.cdiv(kernel_w * channels_per_group, config["BLOCK_K"])
        k_steps = kernel_h * inner_steps
    else:
        inner_steps = triton.cdiv(channels_per_group, config["BLOCK_K"])
        k_steps = kernel_h * kernel_w * inner_steps
    grid = (triton.cdiv(pixels, config["BLOCK_M"]) * triton.cdiv(oc_per_group, config["BLOCK_N"]), groups)
    _conv2d_nhwc[grid](x, w, out, bias, residual, channels_per_group, height, width, oc_per_group, out_h, out_w,
                       pixels, kernel_w, stride_h, stride_w, pad_t, pad_l, dil_h, dil_w,
                       k_steps, inner_steps, *sx, sw_o,
                       *_channel_contiguous(out, "output"),
                       *(_channel_contiguous(residual, "residual") if has_residual else (0, 0, 0)),
                       BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
                       GROUP_M=config["GROUP_M"], ACTIVATION=task.attr("activation", "none"), HAS_BIAS=has_bias,
                       HAS_RESIDUAL=has_residual, TAP_ROWS=config["TAP_ROWS"], DOT_PRECISION=DOT_PRECISION,
                       num_warps=config["num_warps"],
                       num_stages=config["num_stages"])
