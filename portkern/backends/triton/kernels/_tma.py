# --- included from _tma.py: what the tensor memory accelerator needs of a GEMM's operands ---
_ROW_BYTES = 16  # TMA: every row stride (and the base) 16-byte aligned


def _tma_arch_problem(target):
    arch = target.profile.arch
    if not (arch.startswith("sm_") and int(arch[3:]) >= 90):
        return f"TMA needs sm_90 or newer, the target is {arch}"
    return None


def _tma_dtype_problem(task):
    a, b = task.inputs[0], task.inputs[1]
    if a.dtype != b.dtype or a.dtype not in ("float16", "bfloat16", "float32"):
        return f"TMA tiles need one 16/32-bit float type for A and B, not {a.dtype}/{b.dtype}"
    return None


def _item_bytes(task, spec=None):
    """Bytes per element of A (or of `spec`, e.g. the output)."""
    return 4 if (spec or task.inputs[0]).dtype == "float32" else 2


def _misaligned_rows(task):
    """Row lengths (in elements) of A and B whose rows are not 16-byte aligned: () if TMA can read
    the operands where they are."""
    item = _item_bytes(task)
    _, N, K = _gemm_dims(task)
    row_elements = (K,) if task.attr("trans_b", False) else (K, N)
    return tuple(n for n in row_elements if n * item % _ROW_BYTES)


def _tma_problem(task, target):
    """Why TMA cannot read this GEMM's operands where they are, or None."""
    misaligned = _misaligned_rows(task)
    return (_tma_arch_problem(target) or _tma_dtype_problem(task)
            or (misaligned and f"rows of {misaligned} elements are not {_ROW_BYTES}-byte aligned for TMA") or None)


def _stored_b_strides(task, p):
    """B's (row, column) strides as it is stored: N x K when trans_b, else K x N."""
    return p.stride_b[::-1] if task.attr("trans_b", False) else p.stride_b


def _b_descriptor(task, p, b, b_strides, block_n, block_k):
    """A descriptor over B as stored (b_strides as _stored_b_strides gives them), in tiles of
    block_n columns of C by block_k of K."""
    if task.attr("trans_b", False):
        return TensorDescriptor(b, [p.N, p.K], list(b_strides), [block_n, block_k])
    return TensorDescriptor(b, [p.K, p.N], list(b_strides), [block_k, block_n])
