# --- included from _tma.py: what the tensor memory accelerator needs of a GEMM's operands ---
# include: tma_rules


def _tma_dtype_problem(task):
    a, b = task.inputs[0], task.inputs[1]
    if a.dtype != b.dtype or a.dtype not in ("float16", "bfloat16", "float32"):
        return f"TMA tiles need one 16/32-bit float type for A and B, not {a.dtype}/{b.dtype}"
    return None


def _item_bytes(task):
    return _dtype_bytes(task.inputs[0].dtype)


def _misaligned_rows(task):
    """Row lengths (in elements) of A and B whose rows are not 16-byte aligned: () if TMA can read
    the operands where they are."""
    _, N, K = _gemm_dims(task)
    row_elements = (K,) if task.attr("trans_b", False) else (K, N)
    return tuple(n for n in row_elements if not _row_aligned(n, task.inputs[0].dtype))


def _tma_problem(task, target):
    """Why TMA cannot read this GEMM's operands where they are, or None."""
    misaligned = _misaligned_rows(task)
    return (_tma_arch_problem(target) or _tma_dtype_problem(task)
            or (misaligned and f"rows of {misaligned} elements are not {_ROW_BYTES}-byte aligned for TMA") or None)


def _stored_b_strides(task, p):
    """B's (row, column) strides as it is stored: N x K when trans_b, else K x N."""
    return p.stride_b[::-1] if task.attr("trans_b", False) else p.stride_b


def _b_tiling(task, p, block_n, block_k):
    """B's shape as stored and its tile for block_n columns of C by block_k of K: N x K in
    block_n x block_k tiles when trans_b, else K x N in block_k x block_n ones."""
    if task.attr("trans_b", False):
        return [p.N, p.K], [block_n, block_k]
    return [p.K, p.N], [block_k, block_n]


def _b_descriptor(task, p, b, b_strides, block_n, block_k):
    """A descriptor over B as stored (b_strides as _stored_b_strides gives them)."""
    shape, block = _b_tiling(task, p, block_n, block_k)
    return TensorDescriptor(b, shape, list(b_strides), block)
