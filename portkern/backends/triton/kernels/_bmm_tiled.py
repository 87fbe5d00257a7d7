# --- included from _bmm_tiled.py: the batched tiled GEMM (its module sets DOT_PRECISION) ---
# include: gemm_common

SPACE = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [32, 64, 128, 256], "BLOCK_K": [16, 32, 64],
         "GROUP_M": [1, 8], "num_warps": [2, 4, 8], "num_stages": [2, 3, 4]}
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}


def _batch(shape):
    return tuple(shape[:-2])


def _operand_batch_problem(shape, out_batch, what):
    own = _batch(shape)
    if math.prod(own) != 1 and (1,) * (len(out_batch) - len(own)) + own != out_batch:
        return f"{what}'s batch dims {own} broadcast only partly against {out_batch}"
    return None


def _batch_stride(t, out_batch, what):
    """One stride over the flattened batch dims; 0 when the operand is shared by every batch."""
    own = _batch(t.shape)
    if math.prod(own) == 1:
        return 0
    strides = t.stride()[:-2]
    for i in range(len(own) - 1):
        if own[i] != 1 and strides[i] != strides[i + 1] * own[i + 1]:
            raise ValueError(f"{what}: batch dims {own} with strides {strides} do not collapse")
    return strides[-1]


def constraints(task, config, target):
    out_batch = _batch(task.outputs[0].shape)
    return (_dot_precision_problem(task, target) or _operand_batch_problem(task.inputs[0].shape, out_batch, "a")
            or _operand_batch_problem(task.inputs[1].shape, out_batch, "b")
            or _accumulator_problem(config["BLOCK_M"], config["BLOCK_N"], config["num_warps"], target,
                                    _accumulator_limit()))


@triton.jit
def _bmm_tiled(a_ptr, b_ptr, c_ptr, M, N, K, scale, stride_ab, stride_am, stride_ak, stride_bb, stride_bk,
               stride_bn, stride_cb, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SCALED: tl.constexpr,
               DOT_PRECISION: tl.constexpr):
    batch = tl.program_id(1).to(tl.int64)
    block_m, block_n = _swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _dot_tile(acc, a_ptr + batch * stride_ab, b_ptr + batch * stride_bb, rows, cols, M, N, 0, K,
                    stride_am, stride_ak, stride_bk, stride_bn, BLOCK_K, DOT_PRECISION)
    if SCALED:
        acc = acc * scale
    _epilogue_store(acc, c_ptr + batch * stride_cb, c_ptr, c_ptr, rows, cols, M, N, stride_cm, stride_cn,
                    0, 0, "none", False, "none")


def launch(task, config, inputs, outputs):
    a, b, out = inputs[0], inputs[1], outputs[0]
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    out_batch = _batch(out.shape)
    scale = float(task.attr("scale", 1.0))
    tiles = triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"])
    _bmm_tiled[(tiles, math.prod(out_batch))](
        a, b, out, M, N, K, scale, _batch_stride(a, out_batch, "a"), a.stride(-2), a.stride(-1),
        _batch_stride(b, out_batch, "b"), b.stride(-2), b.stride(-1), _batch_stride(out, out_batch, "output"),
        out.stride(-2), out.stride(-1), BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"], GROUP_M=config["GROUP_M"], SCALED=scale != 1.0,
        DOT_PRECISION=DOT_PRECISION, num_warps=config["num_warps"], num_stages=config["num_stages"])
