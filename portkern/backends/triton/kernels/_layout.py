# --- included from _layout.py: a conv or pool task's 4-D buffers in NCHW terms, whatever their layout
def _nchw(task, tensor):
    """A 4-D buffer of the task (data NCHW or NHWC, weight OIHW or OHWI) as an NCHW / OIHW view."""
    return tensor.permute(0, 3, 1, 2) if task.attr("layout") == "nhwc" else tensor


def _nchw_shape(task, shape):
    """The NCHW (OIHW) shape of one of the task's 4-D specs."""
    return (shape[0], shape[3], shape[1], shape[2]) if task.attr("layout") == "nhwc" else tuple(shape)
