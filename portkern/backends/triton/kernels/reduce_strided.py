"""Sum/mean/max/min over any run of consecutive axes: the input seen as outer x reduced x inner.

A program owns BLOCK_I neighbouring inner positions of one outer index and walks its share of the
reduced extent BLOCK_R at a time; loads run along the contiguous inner axis, so reducing a leading
or middle axis (column sums, NCHW over C) stays coalesced with no transpose. When outer x inner is
too small to fill the GPU (a column sum of a tall matrix), SPLIT programs share each reduced
extent: they write fp32 partials to a scratch buffer that a second small kernel combines, in a
fixed order, so the result is deterministic.
"""
import math

import triton
import triton.language as tl

KIND = "reduce"
PRECISION = "fp32"
SPACE = {"BLOCK_R": [1, 4, 16, 64], "BLOCK_I": [16, 64, 256, 1024], "SPLIT": [1, 8, 32, 128],
         "num_warps": [1, 2, 4, 8]}
DEFAULT = {"BLOCK_R": 16, "BLOCK_I": 64, "SPLIT": 1, "num_warps": 4}

COMBINE_BLOCK = 1024  # outputs per program of the partials-combining kernel

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
    reason = _task_reason(task) or _spill_reason(config["BLOCK_R"] * config["BLOCK_I"], config, target)
    if reason is None and config["SPLIT"] > 1:
        n_reduced = _outer_reduced_inner(task)[1]
        if config["SPLIT"] * config["BLOCK_R"] > n_reduced:
            return f"SPLIT={config['SPLIT']} leaves splits with no block of the {n_reduced} reduced elements"
    return reason


def scratch(task, config):
    """fp32 partial results, one row per split, when the reduced extent is split."""
    if config["SPLIT"] == 1:
        return []
    n_outer, _, n_inner = _outer_reduced_inner(task)
    return [((config["SPLIT"], n_outer * n_inner), "float32")]


@triton.jit
def _reduce_strided(x_ptr, y_ptr, n_reduced, n_inner, per_split, OP: tl.constexpr, IDENTITY: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    """Reduce x[outer, split's share of reduced, inner block]; y row `split` (the output when unsplit)."""
    inner_blocks = tl.cdiv(n_inner, BLOCK_I)
    outer = (tl.program_id(0) // inner_blocks).to(tl.int64)
    inner = (tl.program_id(0) % inner_blocks) * BLOCK_I + tl.arange(0, BLOCK_I)
    inner_ok = inner[None, :] < n_inner
    begin = tl.program_id(1) * per_split
    end = tl.minimum(begin + per_split, n_reduced)
    reduced = tl.arange(0, BLOCK_R)[:, None]
    base = x_ptr + outer * n_reduced * n_inner + inner[None, :]
    acc = tl.full([BLOCK_R, BLOCK_I], IDENTITY, tl.float32)
    for start in range(begin, end, BLOCK_R):
        r = start + reduced
        x = tl.load(base + r.to(tl.int64) * n_inner, mask=(r < end) & inner_ok, other=IDENTITY,
                    eviction_policy="evict_first")
        acc = _combine(acc, x.to(tl.float32), OP)
    result = _finish(acc, n_reduced, 0, OP)
    n_out = tl.num_programs(0) // inner_blocks * n_inner
    destination = y_ptr + tl.program_id(1).to(tl.int64) * n_out + outer * n_inner + inner
    tl.store(destination, result.to(y_ptr.dtype.element_ty), mask=inner < n_inner)


@triton.jit
def _combine_partials(partials_ptr, y_ptr, n_split, n_out, n_reduced, OP: tl.constexpr,
                      IDENTITY: tl.constexpr, BLOCK: tl.constexpr):
    index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = index < n_out
    acc = tl.full([BLOCK], IDENTITY, tl.float32)
    for split in range(0, n_split):
        acc = _combine(acc, tl.load(partials_ptr + split * n_out + index, mask=valid, other=IDENTITY), OP)
    if OP == "mean":
        acc = acc / n_reduced
    tl.store(y_ptr + index, acc.to(y_ptr.dtype.element_ty), mask=valid)


def launch(task, config, inputs, outputs):
    n_outer, n_reduced, n_inner = _outer_reduced_inner(task)
    op, split = task.attr("op"), config["SPLIT"]
    grid = (n_outer * triton.cdiv(n_inner, config["BLOCK_I"]), split)
    partial_op = "sum" if op == "mean" and split > 1 else op  # a split mean divides once, at the end
    _reduce_strided[grid](
        inputs[0], outputs[1] if split > 1 else outputs[0], n_reduced, n_inner, triton.cdiv(n_reduced, split),
        OP=partial_op, IDENTITY=_identity(op), BLOCK_R=config["BLOCK_R"], BLOCK_I=config["BLOCK_I"],
        num_warps=config["num_warps"])
    if split > 1:
        n_out = n_outer * n_inner
        _combine_partials[(triton.cdiv(n_out, COMBINE_BLOCK),)](
            outputs[1], outputs[0], split, n_out, n_reduced, OP=op, IDENTITY=_identity(op), BLOCK=COMBINE_BLOCK,
            num_warps=4)
