# --- included from _dot_precision.py: which inputs the module's DOT_PRECISION can multiply ---
def _dot_precision_problem(task, target):
    """tf32 and tf32x3 are ways to multiply fp32 inputs (the module's DOT_PRECISION); ieee takes any.
    tf32x3 is Triton's NVIDIA split (its AMD backend offers bf16x3/bf16x6 instead)."""
    if DOT_PRECISION != "ieee" and task.dtype != "float32":
        return f"{DOT_PRECISION} applies to float32 inputs only"
    if DOT_PRECISION == "tf32x3" and not target.profile.arch.startswith("sm_"):
        return f"tf32x3 products need an NVIDIA target, not {target.profile.arch}"
    return None
