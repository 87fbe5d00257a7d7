# --- included from _splitk.py: split-K workspace and the ordered second pass ---
def _k_chunk(K, split_k, block_k):
    """K columns per split, a multiple of BLOCK_K so every split but the last runs full tiles."""
    return triton.cdiv(triton.cdiv(K, split_k), block_k) * block_k


def _split_problem(K, split_k, block_k):
    """Why this split leaves programs without work, or None."""
    if split_k > 1 and _k_chunk(K, split_k, block_k) * (split_k - 1) >= K:
        return f"SPLIT_K={split_k} with BLOCK_K={block_k} leaves a split of K={K} empty"
    return None


def _partials_scratch(M, N, split_k):
    """fp32 partial sums, one M x N slab per split: the workspace the backend allocates."""
    return [((split_k, M, N), "float32")] if split_k > 1 else []


@triton.jit
def _store_partial(acc, ws_ptr, split, rows, cols, M, N):
    """Write one split's fp32 partial tile to its slab of the (SPLIT_K, M, N) workspace."""
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = split.to(tl.int64) * M * N + rows[:, None].to(tl.int64) * N + cols[None, :]
    tl.store(ws_ptr + offsets, acc, mask=mask)


@triton.jit
def _store_result(acc, c_ptr, ws_ptr, split, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                  stride_rn, SPLIT: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                  RESIDUAL: tl.constexpr):
    """A split program's fp32 partial to the workspace (the second pass finishes it), or an
    unsplit program's tile through the epilogue."""
    if SPLIT:
        _store_partial(acc, ws_ptr, split, rows, cols, M, N)
    else:
        _epilogue_store(acc, c_ptr, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                        stride_rn, ACTIVATION, HAS_BIAS, RESIDUAL)


@triton.jit
def _sum_partials(ws_ptr, rows, cols, M, N, SPLIT_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """A tile's SPLIT_K partials in the (SPLIT_K, M, N) workspace, summed in fp32 in split order."""
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for split in range(SPLIT_K):
        acc += tl.load(ws_ptr + split * M * N + offsets, mask=mask, other=0.0)
    return acc


@triton.jit
def _splitk_reduce(ws_ptr, c_ptr, bias_ptr, res_ptr, M, N, stride_cm, stride_cn, stride_rm, stride_rn,
                   SPLIT_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                   ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr):
    """Second pass: sum the partials in split order (deterministic, no atomics), then the epilogue."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = _sum_partials(ws_ptr, rows, cols, M, N, SPLIT_K, BLOCK_R, BLOCK_C)
    _epilogue_store(acc, c_ptr, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                    stride_rn, ACTIVATION, HAS_BIAS, RESIDUAL)


def _launch_reduce(p, workspace, out, split_k, block_r, block_c, num_warps):
    grid = (triton.cdiv(p.M, block_r), triton.cdiv(p.N, block_c))
    _splitk_reduce[grid](workspace, out, p.bias, p.residual, p.M, p.N, *p.stride_c, *p.stride_r,
                         SPLIT_K=split_k, BLOCK_R=block_r, BLOCK_C=block_c, **p.epilogue,
                         num_warps=num_warps)
