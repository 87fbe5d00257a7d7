"""Sum/mean/max/min over any run of consecutive axes: the input seen as outer x reduced x inner.

A program owns BLOCK_I neighbouring inner positions of one outer index and walks the reduced
extent BLOCK_R at a time; loads run along the contiguous inner axis, so reducing a leading axis
(column sums, NCHW over N or H,W-less channels) stays coalesced with no transpose.
"""
import math

import triton
import triton.language as tl

KIND = "reduce"
PRECISION = "fp32"
SPACE = {"BLOCK_R": [1, 4, 16, 64], "BLOCK_I": [1, 16, 64, 256, 1024], "num_warps": [1, 2, 4, 8]}
DEFAULT = {"BLOCK_R": 16, "BLOCK_I": 64, "num_warps": 4}

OPS = ("sum", "mean", "max", "min")
MAX_ELEMENTS_PER_THREAD = 64  # fp32 values a thread holds before registers spill


def _reduced_axes(task):
    ndim = len(task.inputs[0].shape)
    axes = task.attr("axes") or range(ndim)
    return sorted({axis % ndim for axis in axes}) if ndim else []


def _outer_reduced_inner(task):
    shape = task.inputs[0].shape
    axes = _reduced_axes(task) or [0]
    first, last = axes[0], axes[-1] + 1
    return math.prod(shape[:first]), math.prod(shape[first:last]), math.prod(shape[last:])


def constraints(task, config, target):
    if task.attr("op") not in OPS:
        return f"op {task.attr('op')!r} is not one of {', '.join(OPS)}"
    if task.inputs[0].dtype not in ("float16", "bfloat16", "float32"):
        return f"dtype {task.inputs[0].dtype} is not a float kernels compute in"
    axes = _reduced_axes(task)
    if axes and axes != list(range(axes[0], axes[-1] + 1)):
        return f"axes {axes} are not consecutive"
    if task.inputs[0].numel == 0:
        return "empty tensor"
    tile = config["BLOCK_R"] * config["BLOCK_I"]
    threads = config["num_warps"] * target.profile.warp_size
    if tile > MAX_ELEMENTS_PER_THREAD * threads:
        return f"{tile} elements in registers over {threads} threads would spill"
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
def _reduce_strided(x_ptr, y_ptr, n_reduced, n_inner, OP: tl.constexpr, IDENTITY: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    inner_blocks = tl.cdiv(n_inner, BLOCK_I)
    outer = tl.program_id(0) // inner_blocks
    inner = (tl.program_id(0) % inner_blocks) * BLOCK_I + tl.arange(0, BLOCK_I)
    reduced = tl.arange(0, BLOCK_R)
    base = x_ptr + outer.to(tl.int64) * n_reduced * n_inner + inner[None, :]
    acc = tl.full([BLOCK_R, BLOCK_I], IDENTITY, tl.float32)
    for start in range(0, n_reduced, BLOCK_R):
        r = start + reduced[:, None]
        x = tl.load(base + r.to(tl.int64) * n_inner, mask=(r < n_reduced) & (inner[None, :] < n_inner),
                    other=IDENTITY, eviction_policy="evict_first")
        acc = _combine(acc, x.to(tl.float32), OP)
    if OP == "max":
        result = tl.max(acc, axis=0)
    elif OP == "min":
        result = tl.min(acc, axis=0)
    else:
        result = tl.sum(acc, axis=0)
    if OP == "mean":
        result = result / n_reduced
    tl.store(y_ptr + outer.to(tl.int64) * n_inner + inner, result.to(y_ptr.dtype.element_ty),
             mask=inner < n_inner)


def launch(task, config, inputs, outputs):
    n_outer, n_reduced, n_inner = _outer_reduced_inner(task)
    op = task.attr("op")
    identity = {"max": -math.inf, "min": math.inf}.get(op, 0.0)
    grid = (n_outer * triton.cdiv(n_inner, config["BLOCK_I"]),)
    _reduce_strided[grid](inputs[0], outputs[0], n_reduced, n_inner, OP=op, IDENTITY=identity,
                          BLOCK_R=config["BLOCK_R"], BLOCK_I=config["BLOCK_I"], num_warps=config["num_warps"])
