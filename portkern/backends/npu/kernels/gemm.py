"""GEMM with its epilogue (bias, activation, residual), triton-ascend style: one program per cube
core looping over BLOCK_M x BLOCK_N output tiles; the K loop streams A and B tiles through L1 and
L0A/L0B while the fp32 accumulator stays in L0C. Bias alone rides the cube's bias table; an
activation or residual makes it a cube+vector kernel whose accumulator crosses to the vector cores
through a GM workspace (Atlas A2 has no L0C->UB path), so its tail axes must be 512-byte aligned.
"""
import triton
import triton.language as tl

KIND = "gemm"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128],
         "PROGRAMS": [16, 20, 24], "BUFFERS": [1, 2, 3]}
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "PROGRAMS": 24, "BUFFERS": 2}  # valid for fp16/fp32, every epilogue

ITEMSIZE = {"float16": 2, "float32": 4}
ACTIVATION_VECTOR_OPS = {"none": 0, "relu": 1, "sigmoid": 4, "tanh": 5, "silu": 5, "gelu": 8, "gelu_tanh": 10}


def _geometry(task, config):
    a, b = task.inputs[0], task.inputs[1]
    k = a.shape[-1]
    m = a.numel // k
    n = b.shape[0] if task.attr("trans_b", False) else b.shape[1]
    k_steps = triton.cdiv(k, config["BLOCK_K"])
    out_tiles = triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"])
    return m, n, k, k_steps, out_tiles, min(config["PROGRAMS"], out_tiles)


def _uses_vector(task):
    return task.attr("activation", "none") != "none" or bool(task.attr("residual", False))


def constraints(task, config, target):
    if task.dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    if task.attr("activation", "none") not in ACTIVATION_VECTOR_OPS:
        return f"activation {task.attr('activation')} is not implemented by this variant"
    return None


def schedule(task, config, target):
    m, n, k, k_steps, out_tiles, programs = _geometry(task, config)
    buffers = config["BUFFERS"]
    # masked loads move only the in-bounds part of a tile; the cube works on 16-aligned fractals
    bm, bn, bk = (min(config[f"BLOCK_{axis}"], -(-extent // 16) * 16) for axis, extent in (("M", m), ("N", n), ("K", k)))
    size = ITEMSIZE[task.dtype]
    out_size = ITEMSIZE[task.outputs[0].dtype]
    has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
    operand_bytes = (bm * bk + bk * bn) * size
    per_tile = {"gm_to_l1": operand_bytes + (bn * size / k_steps if has_bias else 0.0),
                "l1_to_l0": operand_bytes, "cube_macs": bm * bn * bk}
    transfers = {"gm_to_l1": 2 + (1 / k_steps if has_bias else 0.0), "l1_to_l0": 2}
    tile_m, tile_n, tile_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    live = {"l1": buffers * (tile_m * tile_k + tile_k * tile_n) * size + (tile_n * size if has_bias else 0),
            "l0a": buffers * tile_m * tile_k * size, "l0b": buffers * tile_k * tile_n * size,
            "l0c": tile_m * tile_n * 4}
    tails = {"l1": [tile_k * size, tile_n * size]}
    footprint = (m * k + k * n + (n if has_bias else 0)) * size + m * n * out_size * (2 if has_residual else 1)
    if _uses_vector(task):
        # the accumulator goes L0C -> GM workspace -> UB of the two vector cores (half each)
        elementwise = task.attr("activation", "none")
        per_tile.update(l0c_to_gm=bm * bn * 4 / k_steps,
                        gm_to_ub=bm * bn * (4 + (size if has_residual else 0)) / k_steps,
                        vector_ops=bm * bn * (ACTIVATION_VECTOR_OPS[elementwise] + has_residual + 1) / k_steps,
                        ub_to_gm=bm * bn * out_size / k_steps)
        transfers.update(l0c_to_gm=1 / k_steps, gm_to_ub=(1 + has_residual) / k_steps, ub_to_gm=1 / k_steps)
        live["ub"] = buffers * tile_m * tile_n // 2 * (4 + out_size + (size if has_residual else 0))
        tails["ub"] = [tile_n * 4, tile_n * out_size]
        footprint += programs * bm * bn * 4
    else:
        per_tile["l0c_to_gm"] = bm * bn * out_size / k_steps
        transfers["l0c_to_gm"] = 1 / k_steps
    row_bytes = [k * size, n * out_size]
    return {
        "core": "mixed" if _uses_vector(task) else "cube", "programs": programs,
        "tiles": triton.cdiv(out_tiles, programs) * k_steps, "total_tiles": out_tiles * k_steps,
        "buffers": buffers, "per_tile": per_tile, "transfers": transfers, "live": live, "tails": tails,
        "gm_alignment": min(min(r & -r for r in row_bytes), 512), "footprint_bytes": footprint,
        "cube_dtype": task.dtype, "vector_op_bytes": 4,
    }


@triton.jit
def _activate(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
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
def _gemm_tiles(a_ptr, b_ptr, bias_ptr, residual_ptr, out_ptr, M, N, K, stride_bk, stride_bn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_cores = tl.num_programs(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    n_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    for tile in range(pid, n_tiles, num_cores):
        rm = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm < M)[:, None] & (rk < K)[None, :], other=0.0)
            b = tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=(rk < K)[:, None] & (rn < N)[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        acc = _activate(acc, ACTIVATION)
        inside = (rm < M)[:, None] & (rn < N)[None, :]
        out_offsets = rm[:, None] * N + rn[None, :]
        if HAS_RESIDUAL:
            acc += tl.load(residual_ptr + out_offsets, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + out_offsets, acc.to(out_ptr.dtype.element_ty), mask=inside)


def launch(task, config, inputs, outputs):
    m, n, k, _, _, programs = _geometry(task, config)
    has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
    a, b = inputs[0], inputs[1]
    bias = inputs[2] if has_bias else a
    residual = inputs[2 + has_bias] if has_residual else a
    stride_bk, stride_bn = (1, k) if task.attr("trans_b", False) else (n, 1)
    _gemm_tiles[(programs,)](a, b, bias, residual, outputs[0], m, n, k, stride_bk, stride_bn,
                             BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
                             ACTIVATION=task.attr("activation", "none"), HAS_BIAS=has_bias,
                             HAS_RESIDUAL=has_residual,
                             DOT_PRECISION="ieee" if task.dtype == "float32" else "tf32")
