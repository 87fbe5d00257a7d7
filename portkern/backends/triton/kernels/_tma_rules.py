# --- included from _tma_rules.py: what any TMA copy needs (sm_90 or newer, 16-byte aligned rows) ---
_ROW_BYTES = 16  # TMA: every row stride (and the base) 16-byte aligned


def _tma_arch_problem(target):
    arch = target.profile.arch
    if not (arch.startswith("sm_") and int(arch[3:]) >= 90):
        return f"TMA needs sm_90 or newer, the target is {arch}"
    return None


def _dtype_bytes(dtype):
    """Bytes per element of the float types TMA tiles take here (fp32, or fp16/bf16)."""
    return 4 if dtype == "float32" else 2


def _row_aligned(elements, dtype):
    """Whether rows of `elements` values of `dtype` keep every row start 16-byte aligned."""
    return elements * _dtype_bytes(dtype) % _ROW_BYTES == 0
