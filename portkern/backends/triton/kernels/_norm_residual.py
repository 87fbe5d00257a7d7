# --- included from _norm_residual.py: the residual a post-norm block adds after its norm ---


def _residual_operands(task, inputs, outputs):
    """(the residual's buffer, whether there is one): a norm task's last input where it has one;
    the output stands in otherwise (never read)."""
    residual = bool(task.attr("residual", False))
    return (inputs[-1] if residual else outputs[0]), residual


@triton.jit
def _plus_residual(y, y_ptr, residual_ptr, offsets, mask, RESIDUAL: tl.constexpr):
    """y + the residual at the same offsets, y first rounded to the output's dtype as the model
    rounds its norm before adding (x + norm(f(x)) in the model's dtype); y unchanged without one."""
    if RESIDUAL:
        residual = tl.load(residual_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        y = y.to(y_ptr.dtype.element_ty).to(tl.float32) + residual
    return y
