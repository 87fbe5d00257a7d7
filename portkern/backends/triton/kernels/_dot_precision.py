# --- included from _dot_precision.py: which inputs the module's DOT_PRECISION can multiply ---
def _dot_precision_problem(task, target):
    """tf32 and tf32x3 are ways to multiply fp32 inputs (the module's DOT_PRECISION); ieee takes any.
    tf32x3 is Triton's NVIDIA split (its AMD backend offers bf16x3/bf16x6 instead)."""
    if DOT_PRECISION != "ieee" and task.dtype != "float32":
        return f"{DOT_PRECISION} applies to float32 inputs only"
    if DOT_PRECISION == "tf32x3" and not target.profile.arch.startswith("sm_"):
        return f"tf32x3 products need an NVIDIA target, not {target.profile.arch}"
    return None


def _accumulator_limit():
    """fp32 accumulator registers a thread may hold beside this module's products: tf32x3 keeps
    each operand tile's tf32 halves in registers too. Its 128-register accumulators spilled 98-395
    accesses into the K loop of gemm_tma_tf32x3, gemm_tiled_tf32x3 and bmm_tiled_tf32x3 (sm_90
    builds, results/cpu-sm90-spill-survey-2026-12-06.log) and ran 1.75-1.95x slower than the best
    tile on an H200 (results/h200-table-half-tail-tf32x3-2026-12-06.json); 64-register ones do
    not spill there."""
    return 64 if DOT_PRECISION == "tf32x3" else 128
