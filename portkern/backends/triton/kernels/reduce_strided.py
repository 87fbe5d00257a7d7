"""Sum/mean/max/min over any run of consecutive axes: the input seen as outer x reduced x inner.

A program owns BLOCK_I neighbouring inner positions of one outer index and walks the reduced
extent BLOCK_R at a time; loads run along the contiguous inner axis, so reducing a leading or
middle axis (column sums, NCHW over H,W-less channels) stays coalesced with no transpose.
"""
import math

import triton
import triton.language as tl

KIND = "reduce"
PRECISION = "fp32"
SPACE = {"BLOCK_R": [1, 4, 16, 64], "BLOCK_I": [1, 16, 64, 256, 1024], "num_warps": [1, 2, 4, 8]}
DEFAULT = {"BLOCK_R": 16, "BLOCK_I": 64, "num_warps": 4}

# include: rowwise
# include: reduce_combine


def _outer_reduced_inner(task):
    shape = task.inputs[0].shape
    axes = _reduced_axes(task) or [0]
    first, last = axes[0], axes[-1] + 1
    return math.prod(shape[:first]), math.prod(shape[first:last]), math.prod(shape[last:])


def constraints(task, config, target):
    axes = _reduced_axes(task)
    if axes and axes != list(range(axes[0], axes[-1] + 1)):
        return f"axes {axes} are not consecutive"
    return _task_reason(task) or _spill_reason(config["BLOCK_R"] * config["BLOCK_I"], config, target)


@triton.jit
def _reduce_strided(x_ptr, y_ptr, n_reduced, n_inner, OP: tl.constexpr, IDENTITY: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    inner_blocks = tl.cdiv(n_inner, BLOCK_I)
    outer = (tl.program_id(0) // inner_blocks).to(tl.int64)
    inner = (tl.program_id(0) % inner_blocks) * BLOCK_I + tl.arange(0, BLOCK_I)
    inner_ok = inner[None, :] < n_inner
    reduced = tl.arange(0, BLOCK_R)[:, None]
    base = x_ptr + outer * n_reduced * n_inner + inner[None, :]
    acc = tl.full([BLOCK_R, BLOCK_I], IDENTITY, tl.float32)
    for start in range(0, n_reduced, BLOCK_R):
        r = start + reduced
        x = tl.load(base + r.to(tl.int64) * n_inner, mask=(r < n_reduced) & inner_ok, other=IDENTITY,
                    eviction_policy="evict_first")
        acc = _combine(acc, x.to(tl.float32), OP)
    result = _finish(acc, n_reduced, 0, OP)
    tl.store(y_ptr + outer * n_inner + inner, result.to(y_ptr.dtype.element_ty), mask=inner < n_inner)


def launch(task, config, inputs, outputs):
    n_outer, n_reduced, n_inner = _outer_reduced_inner(task)
    op = task.attr("op")
    _reduce_strided[(n_outer * triton.cdiv(n_inner, config["BLOCK_I"]),)](
        inputs[0], outputs[0], n_reduced, n_inner, OP=op, IDENTITY=_identity(op), BLOCK_R=config["BLOCK_R"],
        BLOCK_I=config["BLOCK_I"], num_warps=config["num_warps"])
