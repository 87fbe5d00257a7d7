"""Conv2d as an implicit GEMM on the cube, triton-ascend style: one program per cube core loops
over (group, output-pixel tile, output-channel tile); the im2col gather is index math inside the
kernel (no unfolded copy in GM). Per group: M = N*OH*OW, N = OC/group, K = C/group*KH*KW. The
epilogue is act(conv + bias + residual), the ResNet order; a residual or activation makes it a
cube+vector kernel (512-byte aligned UB tails), bias alone rides the cube's bias table.
"""
import triton
import triton.language as tl

KIND = "conv2d"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128],
         "PROGRAMS": [16, 20, 24], "BUFFERS": [1, 2, 3]}
DEFAULT = {"BLOCK_M": 256, "BLOCK_N": 64, "BLOCK_K": 32, "PROGRAMS": 24, "BUFFERS": 2}  # valid for fp16/fp32, every epilogue

ITEMSIZE = {"float16": 2, "float32": 4}
ACTIVATION_VECTOR_OPS = {"none": 0, "relu": 1, "relu6": 2, "sigmoid": 4, "tanh": 5, "silu": 5,
                         "gelu": 8, "gelu_tanh": 10}


def _geometry(task, config):
    n = task.inputs[0].shape[0]
    oc, c_per_group, kh, kw = task.inputs[1].shape
    _, _, oh, ow = task.outputs[0].shape
    group = task.attr("group", 1)
    m, n_cols, k = n * oh * ow, oc // group, c_per_group * kh * kw
    out_tiles = group * triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n_cols, config["BLOCK_N"])
    return m, n_cols, k, group, out_tiles, min(config["PROGRAMS"], out_tiles)


def _uses_vector(task):
    return task.attr("activation", "none") != "none" or bool(task.attr("residual", False))


def constraints(task, config, target):
    if task.dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    if task.attr("activation", "none") not in ACTIVATION_VECTOR_OPS:
        return f"activation {task.attr('activation')} is not implemented by this variant"
    return None


def schedule(task, config, target):
    m, n_cols, k, _, out_tiles, programs = _geometry(task, config)
    size, buffers = ITEMSIZE[task.dtype], config["BUFFERS"]
    tile_m, tile_n, tile_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    bm, bn, bk = (min(block, -(-extent // 16) * 16) for block, extent in ((tile_m, m), (tile_n, n_cols), (tile_k, k)))
    k_steps = triton.cdiv(k, tile_k)
    has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
    # the gathered im2col tile is charged in full: overlapping windows are not reused from L1
    operand_bytes = (bm * bk + bk * bn) * size
    per_tile = {"gm_to_l1": operand_bytes + (bn * size / k_steps if has_bias else 0.0),
                "l1_to_l0": operand_bytes, "cube_macs": bm * bn * bk}
    # one strided DMA per input channel in the K slice covers all its kernel offsets (blockCount/stride)
    taps = task.inputs[1].shape[2] * task.inputs[1].shape[3]
    channels = -(-bk // taps)
    transfers = {"gm_to_l1": 1 + channels + (1 / k_steps if has_bias else 0.0), "l1_to_l0": 2}
    live = {"l1": buffers * (tile_m * tile_k + tile_k * tile_n) * size, "l0a": buffers * tile_m * tile_k * size,
            "l0b": buffers * tile_k * tile_n * size, "l0c": tile_m * tile_n * 4}
    out_bytes = task.outputs[0].nbytes
    footprint = sum(spec.nbytes for spec in task.inputs) + out_bytes
    tails = {"l1": [tile_k * size, tile_n * size]}
    if _uses_vector(task):
        per_tile.update(l0c_to_gm=bm * bn * 4 / k_steps, gm_to_ub=bm * bn * (4 + size * has_residual) / k_steps,
                        vector_ops=bm * bn * (ACTIVATION_VECTOR_OPS[task.attr("activation", "none")]
                                              + has_residual + 1) / k_steps,
                        ub_to_gm=bm * bn * size / k_steps)
        transfers.update(l0c_to_gm=1 / k_steps, gm_to_ub=(1 + has_residual) / k_steps, ub_to_gm=1 / k_steps)
        live["ub"] = buffers * tile_m * tile_n // 2 * (4 + size + size * has_residual)
        tails["ub"] = [tile_m * 4, tile_m * size]  # NCHW output: the pixel axis is innermost
        footprint += programs * tile_m * tile_n * 4
    else:
        per_tile["l0c_to_gm"] = bm * bn * size / k_steps
        transfers["l0c_to_gm"] = 1 / k_steps
    return {
        "core": "mixed" if _uses_vector(task) else "cube", "programs": programs,
        "tiles": triton.cdiv(out_tiles, programs) * k_steps, "total_tiles": out_tiles * k_steps,
        "buffers": buffers, "per_tile": per_tile, "transfers": transfers, "live": live, "tails": tails,
        "gm_alignment": 32, "footprint_bytes": footprint, "cube_dtype": task.dtype, "vector_op_bytes": 4,
    }


@triton.jit
def _activate(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "relu6":
        x = tl.minimum(tl.maximum(x, 0.0), 6.0)
    elif ACTIVATION == "sigmoid":
        x = tl.sigmoid(x)
    elif ACTIVATION == "tanh":
        x = 2.0 * tl.sigmoid(2.0 * x) - 1.0
    elif ACTIVATION == "silu":
        x = x * tl.sigmoid(x)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = 0.5 * x * (1.0 + 2.0 * tl.sigmoid(2.0 * inner) - 1.0)
    return x


@triton.jit
def _conv_tiles(x_ptr, w_ptr, bias_ptr, residual_ptr, out_ptr,
                C, H, W, OC, OH, OW, M, N_PER_GROUP, K, C_PER_GROUP, GROUPS,
                STRIDE_H, STRIDE_W, PAD_T, PAD_L, DIL_H, DIL_W,
                KH: tl.constexpr, KW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                HAS_RESIDUAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_cores = tl.num_programs(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N_PER_GROUP, BLOCK_N)
    n_tiles = GROUPS * tiles_m * tiles_n
    for tile in range(pid, n_tiles, num_cores):
        g = tile // (tiles_m * tiles_n)
        rm = ((tile // tiles_n) % tiles_m) * BLOCK_M + tl.arange(0, BLOCK_M)
        oc = g * N_PER_GROUP + (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        oc_ok = oc < (g + 1) * N_PER_GROUP
        image = rm // (OH * OW)
        oh = (rm // OW) % OH
        ow = rm % OW
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
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
    m, n_cols, k, group, _, programs = _geometry(task, config)
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
                             BLOCK_K=config["BLOCK_K"], ACTIVATION=task.attr("activation", "none"),
                             HAS_BIAS=has_bias, HAS_RESIDUAL=has_residual,
                             DOT_PRECISION="ieee" if task.dtype == "float32" else "tf32")
