# --- included from _conv_nchw.py: the direct NCHW kernels' launch operands and epilogue
# include: conv_common


def _nchw_operands(task, inputs, outputs):
    """What a direct NCHW kernel's launch passes: x, w and out as NCHW / OIHW views (an NHWC task's
    buffers through permuted strides), has_bias, has_residual, bias, residual, the residual's strides
    (zeros where there is none)."""
    x, w, out = _nchw(task, inputs[0]), _nchw(task, inputs[1]), _nchw(task, outputs[0])
    has_bias, has_residual, bias, residual = _epilogue_operands(task, inputs, x)
    residual = _nchw(task, residual) if has_residual else x
    return x, w, out, has_bias, has_residual, bias, residual, residual.stride() if has_residual else (0, 0, 0, 0)


@triton.jit
def _finish_nchw(acc, n, oc, oh, ow, pixel_ok, channel_ok, bias_ptr, res_ptr, o_ptr, sr_n, sr_c, sr_h, sr_w,
                 so_n, so_c, so_h, so_w, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                 HAS_RESIDUAL: tl.constexpr):
    """A tile of output pixels (n, oh, ow) x channels oc in partition.py's conv order,
    act(conv + bias + residual), stored into the NCHW output through its strides."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + oc, mask=channel_ok, other=0.0).to(tl.float32)[None, :]
    mask = pixel_ok[:, None] & channel_ok[None, :]
    if HAS_RESIDUAL:
        acc += tl.load(res_ptr + n[:, None].to(tl.int64) * sr_n + oc[None, :] * sr_c + (oh * sr_h + ow * sr_w)[:, None],
                       mask=mask, other=0.0).to(tl.float32)
    acc = _activate(acc, ACTIVATION)
    tl.store(o_ptr + n[:, None].to(tl.int64) * so_n + oc[None, :] * so_c + (oh * so_h + ow * so_w)[:, None],
             acc.to(o_ptr.dtype.element_ty), mask=mask)
