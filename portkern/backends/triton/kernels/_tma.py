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


def _misaligned_rows(task):
    """Row lengths (in elements) of A and B whose rows are not 16-byte aligned: () if TMA can read
    the operands where they are."""
    item = 4 if task.inputs[0].dtype == "float32" else 2
    _, N, K = _gemm_dims(task)
    row_elements = (K,) if task.attr("trans_b", False) else (K, N)
    return tuple(n for n in row_elements if n * item % _ROW_BYTES)


def _tma_problem(task, target):
    """Why TMA cannot read this GEMM's operands where they are, or None."""
    misaligned = _misaligned_rows(task)
    return (_tma_arch_problem(target) or _tma_dtype_problem(task)
            or (misaligned and f"rows of {misaligned} elements are not {_ROW_BYTES}-byte aligned for TMA") or None)
