# --- included from _conv_common.py: a conv task's geometry and epilogue operands
# include: activation
# include: layout


def _conv_attrs(task):
    """(stride h, w), (pad top, left), (dilation h, w), groups of a conv2d task."""
    return (tuple(task.attr("strides", (1, 1))), tuple(task.attr("pads", (0, 0, 0, 0))[:2]),
            tuple(task.attr("dilations", (1, 1))), int(task.attr("group", 1)))


def _epilogue_operands(task, inputs, placeholder):
    """has_bias, has_residual, bias, residual: an absent one is the placeholder (never read)."""
    has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
    return (has_bias, has_residual, inputs[2] if has_bias else placeholder,
            inputs[2 + has_bias] if has_residual else placeholder)


def _unscaled_input_problem(task):
    """Why a variant that reads x as it is cannot serve the task (squeeze-excite's gate on x), or None."""
    if task.attr("input_scale", False):
        return "x is scaled by a gate per sample and channel: conv2d_nhwc scales it as it loads it"
    return None
