"""Conv2d as an implicit GEMM on the cube, triton-ascend style: one program per cube core walks a
contiguous run of (group, output-pixel tile, output-channel tile) with the GEMM kernel's tile loop
and L1 panels (the cube_tiles include); the im2col gather is index math inside the kernel (no
unfolded copy in GM). Per group: M = N*OH*OW, N = OC/group, K = C/group*KH*KW. The epilogue is
act(conv + bias + residual), the ResNet order; a residual or activation makes it a cube+vector
kernel (512-byte aligned UB tails), bias alone rides the cube's bias table.
"""
import triton
import triton.language as tl

KIND = "conv2d"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128], "L1_STEPS": [1, 2, 4],
         "L1_PANEL": ["none", "a", "b"], "PROGRAMS": [16, 20, 24], "BUFFERS": [1, 2, 3]}
# valid for fp16/fp32 and every epilogue
DEFAULT = {"BLOCK_M": 256, "BLOCK_N": 64, "BLOCK_K": 32, "L1_STEPS": 1, "L1_PANEL": "none", "PROGRAMS": 24,
           "BUFFERS": 2}

# include: cube_tiles


def _problem(task):
    """(M, N, K, groups) of the implicit GEMM per group: pixels x output channels x C/group*KH*KW."""
    n = task.inputs[0].shape[0]
    oc, c_per_group, kh, kw = task.inputs[1].shape
    _, _, oh, ow = task.outputs[0].shape
    group = task.attr("group", 1)
    return n * oh * ow, oc // group, c_per_group * kh * kw, group


def schedule(task, config, target):
    taps = task.inputs[1].shape[2] * task.inputs[1].shape[3]
    # the gathered im2col tile is charged in full (overlapping windows are not reused from L1); one
    # strided DMA per input channel of the slice covers all its kernel offsets (blockCount/stride)
    return _cube_schedule(task, config, target, a_dmas=lambda depth: -(-depth // taps), gm_alignment=32,
                          ub_lanes=config["BLOCK_M"])  # NCHW output: the pixel axis is innermost


@triton.jit
def _conv_tiles(x_ptr, w_ptr, bias_ptr, residual_ptr, out_ptr,
                C, H, W, OC, OH, OW, M, N_PER_GROUP, K, C_PER_GROUP, GROUPS,
                STRIDE_H, STRIDE_W, PAD_T, PAD_L, DIL_H, DIL_W,
                KH: tl.constexpr, KW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                K_SLICE: tl.constexpr, ALONG_M: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                HAS_RESIDUAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N_PER_GROUP, BLOCK_N)
    first, last = _run_bounds(GROUPS * tiles_m * tiles_n)
    for tile in range(first, last):
        g = tile // (tiles_m * tiles_n)
        tile_m, tile_n = _tile_coords(tile % (tiles_m * tiles_n), tiles_m, tiles_n, ALONG_M)
        rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        oc = g * N_PER_GROUP + tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        oc_ok = oc < (g + 1) * N_PER_GROUP
        image = rm // (OH * OW)
        oh = (rm // OW) % OH
        ow = rm % OW
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, K_SLICE):  # one L1 slice; the cube takes it BLOCK_K columns at a time
            rk = k0 + tl.arange(0, K_SLICE)
            channel = g * C_PER_GROUP + rk // (KH * KW)
            ih = oh[:, None] * STRIDE_H - PAD_T + ((rk // KW) % KH)[None, :] * DIL_H
            iw = ow[:, None] * STRIDE_W - PAD_L + (rk % KW)[None, :] * DIL_W
            in_image = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a_ok = in_image & (rm < M)[:, None] & (rk < K)[None, :]
            a_offsets = ((image[:, None] * C + channel[None, :]) * H + ih) * W + iw
            a = tl.load(x_ptr + a_offsets, mask=a_ok, other=0.0)
            b = tl.load(w_ptr + oc[None, :] * K + rk[:, None], mask=(rk < K)[:, None] & oc_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        inside = (rm < M)[:, None] & oc_ok[None, :]
        out_offsets = ((image[:, None] * OC + oc[None, :]) * OH + oh[:, None]) * OW + ow[:, None]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + oc, mask=oc_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_RESIDUAL:
            acc += tl.load(residual_ptr + out_offsets, mask=inside, other=0.0).to(tl.float32)
        acc = _activate(acc, ACTIVATION)
        tl.store(out_ptr + out_offsets, acc.to(out_ptr.dtype.element_ty), mask=inside)


def launch(task, config, inputs, outputs):
    m, n_cols, k, group = _problem(task)
    programs = _tile_grid(task, config)[3]
    _, c, h, w = task.inputs[0].shape
    oc, c_per_group, kh, kw = task.inputs[1].shape
    _, _, oh, ow = task.outputs[0].shape
    has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if has_bias else x
    residual = inputs[2 + has_bias] if has_residual else x
    stride_h, stride_w = task.attr("strides", (1, 1))
    pad_t, pad_l = task.attr("pads", (0, 0, 0, 0))[:2]
    dil_h, dil_w = task.attr("dilations", (1, 1))
    _conv_tiles[(programs,)](x, weight, bias, residual, outputs[0], c, h, w, oc, oh, ow, m, n_cols, k,
                             c_per_group, group, stride_h, stride_w, pad_t, pad_l, dil_h, dil_w,
                             KH=kh, KW=kw, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
                             K_SLICE=config["BLOCK_K"] * config["L1_STEPS"], ALONG_M=config["L1_PANEL"] == "b",
                             ACTIVATION=task.attr("activation", "none"),
                             HAS_BIAS=has_bias, HAS_RESIDUAL=has_residual,
                             DOT_PRECISION="ieee" if task.dtype == "float32" else "tf32")
