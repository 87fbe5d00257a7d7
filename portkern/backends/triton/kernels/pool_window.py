"""Max / average / global-average pooling over NCHW or NHWC, one program per BLOCK outputs.

Outputs are numbered in the buffer's own order, (n, c, oh, ow) or (n, oh, ow, c), so
neighbouring lanes read neighbouring input columns or channels; each output walks its KH x KW
window (a loop, not unrolled, so global windows stay small code) with padding and window ends
masked. Average divides by the real elements, or by the padded window clipped to the explicit
pads when count_include_pad is set (ONNX semantics).
"""
import math

import triton
import triton.language as tl

KIND = "pool"
PRECISION = "fp32"
SPACE = {"BLOCK": [64, 128, 256, 512, 1024, 2048], "num_warps": [1, 2, 4, 8]}
DEFAULT = {"BLOCK": 256, "num_warps": 4}

OPS = ("max", "avg", "global_avg")
# include: rowwise
# include: layout


def _geometry(task):
    """(kernel, strides, begin pads, end pads) for H and W; global pooling is one whole-image window."""
    height, width = _nchw_shape(task, task.inputs[0].shape)[2:]
    if task.attr("op") == "global_avg":
        return (height, width), (1, 1), (0, 0), (0, 0)
    kernel = tuple(task.attr("kernel"))
    strides = tuple(task.attr("strides") or (1, 1))
    pads = tuple(task.attr("pads") or (0, 0, 0, 0))
    return kernel, strides, pads[:2], pads[2:]


def constraints(task, config, target):
    if task.attr("op") not in OPS:
        return f"op {task.attr('op')!r} is not one of {', '.join(OPS)}"
    if len(task.inputs[0].shape) != 4:
        return "pooling kernels take 4-D NCHW or NHWC input"
    if any(d != 1 for d in task.attr("dilations") or (1, 1)):
        return "dilated pooling windows are not supported"
    if task.outputs[0].numel == 0:
        return "empty output"
    return _spill_reason(config["BLOCK"], config, target)


@triton.jit
def _pool_window(x_ptr, y_ptr, n_outputs, channels, height, width, out_height, out_width,
                 KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                 PAD_TOP: tl.constexpr, PAD_LEFT: tl.constexpr, PAD_BOTTOM: tl.constexpr,
                 PAD_RIGHT: tl.constexpr, IS_MAX: tl.constexpr, COUNT_PADS: tl.constexpr,
                 CHANNELS_LAST: tl.constexpr, BLOCK: tl.constexpr):
    """NCHW: each (n, c) plane is an image of one channel (channels = 1 below); NHWC: an image
    holds `channels` interleaved planes and a lane starts at its channel."""
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = index < n_outputs
    if CHANNELS_LAST:
        pixel = index // channels
        image = x_ptr + (pixel // (out_width * out_height)) * height * width * channels + index % channels
    else:
        pixel = index
        image = x_ptr + (pixel // (out_width * out_height)) * height * width
    ow = pixel % out_width
    oh = (pixel // out_width) % out_height
    top = oh * SH - PAD_TOP
    left = ow * SW - PAD_LEFT
    if IS_MAX:
        acc = tl.full([BLOCK], -float("inf"), tl.float32)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
    for kh in range(KH):
        ih = top + kh
        row_ok = valid & (ih >= 0) & (ih < height)
        for kw in range(KW):
            iw = left + kw
            ok = row_ok & (iw >= 0) & (iw < width)
            if IS_MAX:
                x = tl.load(image + (ih * width + iw) * channels, mask=ok, other=-float("inf"))
                acc = tl.maximum(acc, x.to(tl.float32))
            else:
                acc += tl.load(image + (ih * width + iw) * channels, mask=ok, other=0.0).to(tl.float32)
    if not IS_MAX:
        if COUNT_PADS:
            lo_h, hi_h = -PAD_TOP, height + PAD_BOTTOM
            lo_w, hi_w = -PAD_LEFT, width + PAD_RIGHT
        else:
            lo_h, hi_h = 0, height
            lo_w, hi_w = 0, width
        rows = tl.minimum(top + KH, hi_h) - tl.maximum(top, lo_h)
        cols = tl.minimum(left + KW, hi_w) - tl.maximum(left, lo_w)
        acc = acc / (rows * cols).to(tl.float32)
    tl.store(y_ptr + index, acc.to(y_ptr.dtype.element_ty), mask=valid)


def launch(task, config, inputs, outputs):
    channels_last = task.attr("layout") == "nhwc"
    height, width = _nchw_shape(task, task.inputs[0].shape)[2:]
    out_height, out_width = _nchw_shape(task, task.outputs[0].shape)[2:]
    (kh, kw), (sh, sw), (pad_top, pad_left), (pad_bottom, pad_right) = _geometry(task)
    n_outputs = math.prod(task.outputs[0].shape)
    _pool_window[(triton.cdiv(n_outputs, config["BLOCK"]),)](
        inputs[0], outputs[0], n_outputs, task.inputs[0].shape[3] if channels_last else 1, height, width,
        out_height, out_width,
        KH=kh, KW=kw, SH=sh, SW=sw, PAD_TOP=pad_top, PAD_LEFT=pad_left, PAD_BOTTOM=pad_bottom,
        PAD_RIGHT=pad_right, IS_MAX=task.attr("op") == "max",
        COUNT_PADS=bool(task.attr("count_include_pad", 0)), CHANNELS_LAST=channels_last, BLOCK=config["BLOCK"],
        num_warps=config["num_warps"])
