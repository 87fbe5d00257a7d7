"""Max / average / global-average pooling over NCHW, triton-ascend style: one program per vector
core loops over tiles of BLOCK outputs (numbered row-major n, c, oh, ow); each output walks its
KH x KW window with padding masked. Average divides by the real elements, or by the padded window
clipped to the explicit pads when count_include_pad is set (ONNX semantics).
"""
import triton
import triton.language as tl

KIND = "pool"
PRECISION = "fp32"
SPACE = {"BLOCK": [256, 512, 1024, 2048, 4096], "PROGRAMS": [24, 32, 40, 48], "BUFFERS": [1, 2, 3]}
DEFAULT = {"BLOCK": 1024, "PROGRAMS": 48, "BUFFERS": 2}

ITEMSIZE = {"float16": 2, "float32": 4}
OPS = ("max", "avg", "global_avg")


def _window(task):
    """(kernel, strides, begin pads, end pads) for H and W; global pooling is one whole-image window."""
    height, width = task.inputs[0].shape[2:]
    if task.attr("op") == "global_avg":
        return (height, width), (1, 1), (0, 0), (0, 0)
    pads = tuple(task.attr("pads") or (0, 0, 0, 0))
    return tuple(task.attr("kernel")), tuple(task.attr("strides") or (1, 1)), pads[:2], pads[2:]


def constraints(task, config, target):
    if task.dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    if task.attr("op") not in OPS:
        return f"op {task.attr('op')!r} is not one of {', '.join(OPS)}"
    if len(task.inputs[0].shape) != 4:
        return "pooling kernels take NCHW input"
    if any(d != 1 for d in task.attr("dilations") or (1, 1)):
        return "dilated pooling windows are not supported"
    return None


def schedule(task, config, target):
    n_out = task.outputs[0].numel
    (kh, kw), _, _, _ = _window(task)
    size = ITEMSIZE[task.dtype]
    block = config["BLOCK"]
    n_tiles = triton.cdiv(n_out, block)
    programs = min(config["PROGRAMS"], n_tiles)
    moved = min(block, n_out)
    return {
        "core": "vector", "programs": programs, "tiles": triton.cdiv(n_tiles, programs), "total_tiles": n_tiles,
        "buffers": config["BUFFERS"],
        # a window element per output per step: overlapping windows are read again (no L1 reuse)
        "per_tile": {"gm_to_ub": moved * kh * kw * size, "ub_to_gm": moved * size,
                     "vector_ops": block * (kh * kw * 2 + 2)},
        "transfers": {"gm_to_ub": kh * kw},
        "live": {"ub": config["BUFFERS"] * 2 * block * size + 2 * block * 4},
        "tails": {"ub": [block * size]},
        "gm_alignment": 32,
        "footprint_bytes": (task.inputs[0].numel + n_out) * size, "vector_op_bytes": 4,
    }


@triton.jit
def _pool_blocks(x_ptr, out_ptr, n_out, channels_in_batch, height, width, out_h, out_w,
                 stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right,
                 KH: tl.constexpr, KW: tl.constexpr, IS_MAX: tl.constexpr, COUNT_PAD: tl.constexpr,
                 BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    num_cores = tl.num_programs(0)
    for tile in range(pid, tl.cdiv(n_out, BLOCK), num_cores):
        offsets = tile * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n_out
        ow = offsets % out_w
        oh = (offsets // out_w) % out_h
        plane = offsets // (out_w * out_h)  # n * C + c
        top = oh * stride_h - pad_top
        left = ow * stride_w - pad_left
        if IS_MAX:
            acc = tl.full((BLOCK,), -float("inf"), tl.float32)
        else:
            acc = tl.zeros((BLOCK,), tl.float32)
        count = tl.zeros((BLOCK,), tl.float32)
        for i in range(KH):
            for j in range(KW):
                h = top + i
                w = left + j
                ok = inside & (h >= 0) & (h < height) & (w >= 0) & (w < width)
                x = tl.load(x_ptr + (plane * height + h) * width + w, mask=ok, other=0.0).to(tl.float32)
                if IS_MAX:
                    acc = tl.where(ok, tl.maximum(acc, x), acc)
                else:
                    acc += x
                count += ok.to(tl.float32)
        if IS_MAX:
            y = acc
        else:
            if COUNT_PAD:  # the window clipped to the padded extent, not to the image
                h_end = tl.minimum(top + KH, height + pad_bottom)
                w_end = tl.minimum(left + KW, width + pad_right)
                count = ((h_end - top) * (w_end - left)).to(tl.float32)
            y = acc / tl.maximum(count, 1.0)
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=inside)


def launch(task, config, inputs, outputs):
    batch, channels, height, width = task.inputs[0].shape
    out_h, out_w = task.outputs[0].shape[2:]
    (kh, kw), (stride_h, stride_w), (pad_top, pad_left), (pad_bottom, pad_right) = _window(task)
    n_out = task.outputs[0].numel
    programs = min(config["PROGRAMS"], triton.cdiv(n_out, config["BLOCK"]))
    _pool_blocks[(programs,)](inputs[0], outputs[0], n_out, batch * channels, height, width, out_h, out_w,
                              stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right,
                              KH=kh, KW=kw, IS_MAX=task.attr("op") == "max",
                              COUNT_PAD=bool(task.attr("count_include_pad", False)), BLOCK=config["BLOCK"])
