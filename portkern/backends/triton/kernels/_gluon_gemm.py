# --- included from _gluon_gemm.py: what a Gluon GEMM that reads and writes by TMA needs (fp16/bf16) ---
# include: gemm_common

# include: tma

# include: gluon_descriptors


def _gluon_gemm_problem(task, target, name):
    """Why kernel `name` cannot serve this GEMM, or None: half-precision products into the same
    type, rows of A, B and C whole for TMA, a residual of the output's shape."""
    out = task.outputs[0]
    if task.dtype not in _GL_DTYPES or out.dtype != task.dtype:
        return f"{name} multiplies float16/bfloat16 into the same type, not {task.dtype} -> {out.dtype}"
    if not _row_aligned(out.shape[-1], out.dtype):
        return f"output rows of {out.shape[-1]} {out.dtype} are not {_ROW_BYTES}-byte aligned for a TMA store"
    return _tma_problem(task, target) or _residual_problem(task)
