# --- included from _cube_common.py: what every cube kernel shares (item sizes, the fractal, activations, the
# GEMM's K step, the vector epilogue) ---
ITEMSIZE = {"float16": 2, "float32": 4}
ACTIVATION_VECTOR_OPS = {"none": 0, "relu": 1, "relu6": 2, "sigmoid": 4, "tanh": 5, "silu": 5, "gelu": 8,
                         "gelu_tanh": 10, "hardswish": 5, "relu_squared": 2}


def _residual_join(task):
    """How a GEMM's last operand joins its epilogue: "none", "add" (a residual) or "mul" (a gate,
    as SwiGLU's silu(x @ W_gate) * up)."""
    return task.attr("residual_op", "add") if task.attr("residual", False) else "none"


def _fractal(extent):
    """The extent rounded up to the cube's 16-element fractal."""
    return -(-extent // 16) * 16


@triton.jit
def _activate(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "relu6":
        x = tl.minimum(tl.maximum(x, 0.0), 6.0)
    elif ACTIVATION == "hardswish":
        x = x * tl.minimum(tl.maximum(x * 0.16666666666666666 + 0.5, 0.0), 1.0)
    elif ACTIVATION == "relu_squared":
        x = tl.maximum(x, 0.0)
        x = x * x
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
def _tile_operands(a_ptr, b_ptr, rm, rn, M, N, K, stride_bk, stride_bn, K_SLICE: tl.constexpr):
    """The tile's first K slice of A and of B (pointers, and which rows and columns exist), once per
    tile: the K loop only moves them along K (in the interpreter each op costs about the same
    whatever its size, so what does not change over K is not recomputed there)."""
    rk = tl.arange(0, K_SLICE)
    return (a_ptr + rm[:, None] * K + rk[None, :], (rm < M)[:, None],
            b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn, (rn < N)[None, :])


@triton.jit
def _k_step(acc, a_slice, a_rows_in, b_slice, b_cols_in, k0, K, stride_bk, K_SLICE: tl.constexpr,
            EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One L1 load of A rows and B columns, K_SLICE deep from k0 and none past K (the end of the
    program's part of K), into the accumulator; EVEN_K: no slice reaches past it, so no K mask."""
    if EVEN_K:
        a = tl.load(a_slice + k0, mask=a_rows_in, other=0.0)
        b = tl.load(b_slice + k0 * stride_bk, mask=b_cols_in, other=0.0)
    else:
        k_in = k0 + tl.arange(0, K_SLICE) < K
        a = tl.load(a_slice + k0, mask=a_rows_in & k_in[None, :], other=0.0)
        b = tl.load(b_slice + k0 * stride_bk, mask=k_in[:, None] & b_cols_in, other=0.0)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _vector_epilogue(tile_sum, residual_ptr, out_ptr, row0, rn, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     EPILOGUE_ROWS: tl.constexpr, PARTS: tl.constexpr, ACTIVATION: tl.constexpr,
                     RESIDUAL: tl.constexpr):
    """The vector cores' part: a tile's sum from the workspace (the sum of PARTS partial tiles
    stored one after another, in order), one UB chunk of rows at a time."""
    for r0 in range(0, tl.minimum(BLOCK_M, M - row0), EPILOGUE_ROWS):
        rows = r0 + tl.arange(0, EPILOGUE_ROWS)
        chunk = rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        x = tl.load(tile_sum + chunk).to(tl.float32)
        for part in range(1, PARTS):
            x += tl.load(tile_sum + part * BLOCK_M * BLOCK_N + chunk).to(tl.float32)
        x = _activate(x, ACTIVATION)
        rm = row0 + rows
        inside = (rm < M)[:, None] & (rn < N)[None, :]
        offsets = rm[:, None] * N + rn[None, :]
        if RESIDUAL != "none":
            other = tl.load(residual_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
            if RESIDUAL == "mul":
                x = x * other
            else:
                x = x + other
        tl.store(out_ptr + offsets, x.to(out_ptr.dtype.element_ty), mask=inside)
