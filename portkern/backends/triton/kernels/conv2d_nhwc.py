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

SPLIT_K > 1 is for deep convs on few pixels (ResNet-50's 3x3 512-channel conv at 7x7, batch 32:
~100 output tiles for 132 SMs): program (tile, group, split) runs a contiguous range of the K steps
and writes its fp32 partial tile to a workspace of groups x SPLIT_K x pixels x channels-per-group
(`scratch`); a second pass sums the partials in split order (_splitk.py: no atomics, bit-identical
run to run) and applies the epilogue once, to the full sum.
"""
import math

import triton
import triton.language as tl

KIND = "conv2d"
PRECISION = "fp32"
DOT_PRECISION = "ieee"
SPACE = {"BLOCK_M": [32, 64, 128, 256], "BLOCK_N": [32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128],
         "GROUP_M": [1, 8], "num_warps": [4, 8], "num_stages": [2, 3, 4, 5], "TAP_ROWS": [False, True],
         "SPLIT_K": [1, 2, 4, 8]}
# the best geomean over ResNet-50's b32 convs on an H200, 1.06x of each shape's best of 21 configs
# (benchmarks/results/h200-grid-conv-nhwc-2026-12-03.json)
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4,
           "TAP_ROWS": False, "SPLIT_K": 1}

# include: gemm_common
# include: conv_common
# include: splitk


def constraints(task, config, target):
    if task.attr("layout") != "nhwc":
        return "this variant reads NHWC buffers (the channels-last graph)"
    if problem := _residual_problem(task):
        return problem
    group, block_k = int(task.attr("group", 1)), config["BLOCK_K"]
    channels, (kernel_h, kernel_w) = task.inputs[0].shape[3] // group, task.inputs[1].shape[1:3]
    if config["TAP_ROWS"]:
        if channels >= block_k:
            return f"a tap's {channels} channels fill BLOCK_K {block_k}: filter rows would add nothing"
        if group != 1 or tuple(task.attr("dilations", (1, 1)))[1] != 1:
            return "a filter row is one contiguous run only without groups and column dilation"
        if block_k > max(16, triton.next_power_of_2(kernel_w * channels)):
            return f"BLOCK_K {block_k} exceeds a filter row's {kernel_w * channels} values: mostly padding"
    elif block_k > max(16, triton.next_power_of_2(channels)):
        return f"BLOCK_K {block_k} exceeds the {channels} channels of one tap: mostly padding"
    k_steps = _k_steps(config, kernel_h, kernel_w, channels)[1]
    if problem := _split_problem(k_steps * block_k, config["SPLIT_K"], block_k):  # K as the loop walks it
        return f"{problem} ({k_steps} K steps)"
    batch, out_h, out_w, out_channels = task.outputs[0].shape
    tiles = (triton.cdiv(batch * out_h * out_w, config["BLOCK_M"]) * triton.cdiv(out_channels // group,
                                                                                 config["BLOCK_N"]) * group)
    if config["SPLIT_K"] > 1 and tiles >= target.profile.cores:
        return f"{tiles} output tiles already fill the {target.profile.cores} cores: a split adds only its second pass"
    return _accumulator_problem(config["BLOCK_M"], config["BLOCK_N"], config["num_warps"], target)


def _k_steps(config, kernel_h, kernel_w, channels_per_group):
    """(K steps per tap, or with TAP_ROWS per filter row; K steps in all)."""
    if config["TAP_ROWS"]:
        inner_steps = triton.cdiv(kernel_w * channels_per_group, config["BLOCK_K"])
        return inner_steps, kernel_h * inner_steps
    inner_steps = triton.cdiv(channels_per_group, config["BLOCK_K"])
    return inner_steps, kernel_h * kernel_w * inner_steps


def scratch(task, config):
    """SPLIT_K > 1: the fp32 partials, one (SPLIT_K, pixels, channels) workspace per group."""
    batch, out_h, out_w, out_channels = task.outputs[0].shape
    groups = int(task.attr("group", 1))
    return [((groups, *shape), dtype) for shape, dtype in
            _partials_scratch(batch * out_h * out_w, out_channels // groups, config["SPLIT_K"])]


@triton.jit
def _group_partials(ws_ptr, group, P, OC_G, SPLIT_K: tl.constexpr):
    """The (SPLIT_K, P, OC_G) workspace of one group."""
    return ws_ptr + group.to(tl.int64) * SPLIT_K * P * OC_G


@triton.jit
def _nhwc_epilogue_store(acc, o_ptr, bias_ptr, res_ptr, n, oh, ow, oc, pixel_ok, channel_ok, so_n, so_h, so_w,
                         sr_n, sr_h, sr_w, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                         HAS_RESIDUAL: tl.constexpr):
    """out = act(conv + bias + residual) (partition.py's conv order) in fp32, then one store."""
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


@triton.jit
def _conv2d_nhwc(x_ptr, w_ptr, o_ptr, ws_ptr, bias_ptr, res_ptr, gate_ptr, C_G, H, W, OC_G, OH, OW, P, KW,
                 stride_h, stride_w, pad_t, pad_l, dil_h, dil_w, k_steps, inner_steps, split_steps,
                 sx_n, sx_h, sx_w, sw_o, so_n, so_h, so_w, sr_n, sr_h, sr_w, sg_n,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                 INPUT_SCALE: tl.constexpr, TAP_ROWS: tl.constexpr, SPLIT_K: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """inner_steps: K steps per tap, or with TAP_ROWS per filter row; split_steps: K steps per split.
    INPUT_SCALE: x is read times the gate (N, 1, 1, C) of its sample and channel, rounded to x's
    dtype as the model's product is (squeeze-excite; zero padding stays zero)."""
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
    gate_rows = gate_ptr + n.to(tl.int64) * sg_n + group * C_G
    oc = group * OC_G + channels
    w_cols = w_ptr + oc.to(tl.int64) * sw_o
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SPLIT_K > 1:
        k_lo = tl.program_id(2) * split_steps
        k_hi = tl.minimum(k_lo + split_steps, k_steps)
    else:
        k_lo = 0
        k_hi = k_steps
    for step in range(k_lo, k_hi):
        if TAP_ROWS:  # values j of filter row kh: tap j // C_G, channel j % C_G, at offset j
            kh = step // inner_steps
            js = (step % inner_steps) * BLOCK_K + ks
            k_ok = js < KW * C_G
            ih = top + kh * dil_h
            iw = left[:, None] + (js // C_G)[None, :]
            inside = (pixel_ok & (ih >= 0) & (ih < H))[:, None] & (iw >= 0) & (iw < W) & k_ok[None, :]
            a = tl.load((x_rows + ih * sx_h + left * sx_w)[:, None] + js[None, :], mask=inside, other=0.0)
            if INPUT_SCALE:
                a = _gated(a, gate_rows, js % C_G, pixel_ok[:, None] & k_ok[None, :])
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
            if INPUT_SCALE:
                a = _gated(a, gate_rows, cs, pixel_ok[:, None] & c_ok[None, :])
            b = tl.load(w_cols[None, :] + (tap * C_G + cs)[:, None], mask=c_ok[:, None] & channel_ok[None, :],
                        other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if SPLIT_K > 1:
        _store_partial(acc, _group_partials(ws_ptr, group, P, OC_G, SPLIT_K), tl.program_id(2), pixels, channels,
                       P, OC_G)
    else:
        _nhwc_epilogue_store(acc, o_ptr, bias_ptr, res_ptr, n, oh, ow, oc, pixel_ok, channel_ok, so_n, so_h, so_w,
                             sr_n, sr_h, sr_w, ACTIVATION, HAS_BIAS, HAS_RESIDUAL)


@triton.jit
def _gated(a, gate_rows, channels, mask):
    """The A tile times each pixel's sample's gate at its channels, in x's dtype."""
    gate = tl.load(gate_rows[:, None] + channels[None, :], mask=mask, other=0.0)
    return (a.to(tl.float32) * gate.to(tl.float32)).to(a.dtype)


@triton.jit
def _conv2d_nhwc_reduce(ws_ptr, o_ptr, bias_ptr, res_ptr, OC_G, OH, OW, P, so_n, so_h, so_w, sr_n, sr_h, sr_w,
                        SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """Second pass of SPLIT_K > 1: a group's partials summed in split order, then the epilogue once."""
    group = tl.program_id(2)
    pixels = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    channels = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _sum_partials(_group_partials(ws_ptr, group, P, OC_G, SPLIT_K), pixels, channels, P, OC_G, SPLIT_K,
                        BLOCK_M, BLOCK_N)
    _nhwc_epilogue_store(acc, o_ptr, bias_ptr, res_ptr, pixels // (OH * OW), (pixels // OW) % OH, pixels % OW,
                         group * OC_G + channels, pixels < P, channels < OC_G, so_n, so_h, so_w, sr_n, sr_h, sr_w,
                         ACTIVATION, HAS_BIAS, HAS_RESIDUAL)


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
    input_scale = bool(task.attr("input_scale", False))
    gate = inputs[-1] if input_scale else x
    pixels = batch * out_h * out_w
    oc_per_group = out_channels // groups
    sx = _channel_contiguous(x, "input")
    sw_o, sw_h, sw_w = _channel_contiguous(w, "weight")
    if (sw_h, sw_w) != (kernel_w * channels_per_group, channels_per_group):
        raise ValueError(f"the OHWI weight must be contiguous within each output channel (strides {w.stride()})")
    if config["TAP_ROWS"] and sx[2] != channels:
        raise ValueError(f"filter rows need pixels stored back to back (input strides {x.stride()})")
    inner_steps, k_steps = _k_steps(config, kernel_h, kernel_w, channels_per_group)
    bm, bn, bk, split_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["SPLIT_K"]
    split_steps = _k_chunk(k_steps * bk, split_k, bk) // bk  # as constraints' _split_problem splits K
    workspace = outputs[1] if split_k > 1 else out
    so = _channel_contiguous(out, "output")
    sr = _channel_contiguous(residual, "residual") if has_residual else (0, 0, 0)
    epilogue = {"ACTIVATION": task.attr("activation", "none"), "HAS_BIAS": has_bias, "HAS_RESIDUAL": has_residual}
    grid = (triton.cdiv(pixels, bm) * triton.cdiv(oc_per_group, bn), groups, split_k)
    _conv2d_nhwc[grid](x, w, out, workspace, bias, residual, gate, channels_per_group, height, width, oc_per_group,
                       out_h, out_w, pixels, kernel_w, stride_h, stride_w, pad_t, pad_l, dil_h, dil_w,
                       k_steps, inner_steps, split_steps, *sx, sw_o, *so, *sr, gate.stride(0),
                       BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config["GROUP_M"], **epilogue,
                       INPUT_SCALE=input_scale, TAP_ROWS=config["TAP_ROWS"], SPLIT_K=split_k,
                       DOT_PRECISION=DOT_PRECISION,
                       num_warps=config["num_warps"], num_stages=config["num_stages"])
    if split_k > 1:
        grid = (triton.cdiv(pixels, bm), triton.cdiv(oc_per_group, bn), groups)
        _conv2d_nhwc_reduce[grid](workspace, out, bias, residual, oc_per_group, out_h, out_w, pixels, *so, *sr,
                                  SPLIT_K=split_k, BLOCK_M=bm, BLOCK_N=bn, **epilogue,
                                  num_warps=config["num_warps"])
