OPS = ("sum", "mean", "max", "min")


def _identity(op):
    """The value masked lanes hold so they never change the result."""
    return {"max": -math.inf, "min": math.inf}.get(op, 0.0)


def _reduced_axes(task):
    """The reduced axes, sorted and non-negative; no axes means all of them (ONNX)."""
    ndim = len(task.inputs[0].shape)
    axes = task.attr("axes") or range(ndim)
    return sorted({axis % ndim for axis in axes}) if ndim else []


def _task_reason(task):
    """Why no reduce kernel here can run this task (op, dtype, size), or None."""
    if task.attr("op") not in OPS:
        return f"op {task.attr('op')!r} is not one of {', '.join(OPS)}"
    if task.inputs[0].dtype not in ("float16", "bfloat16", "float32"):
        return f"dtype {task.inputs[0].dtype} is not a float these kernels compute in"
    if task.inputs[0].numel == 0:
        return "empty tensor"
    return None


@triton.jit
def _combine(acc, x, OP: tl.constexpr):
    if OP == "max":
        return tl.maximum(acc, x)
    elif OP == "min":
        return tl.minimum(acc, x)
    else:
        return acc + x


@triton.jit
def _finish(acc, count, axis: tl.constexpr, OP: tl.constexpr):
    """Reduce the lane-wise accumulator along `axis`; mean divides by the reduced count."""
    if OP == "max":
        return tl.max(acc, axis=axis)
    elif OP == "min":
        return tl.min(acc, axis=axis)
    elif OP == "mean":
        return tl.sum(acc, axis=axis) / count
    else:
        return tl.sum(acc, axis=axis)
