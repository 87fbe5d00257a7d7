"""Sum/mean/max/min over the trailing axes: the input seen as rows x cols, ROWS_PER_PROGRAM rows a program.

Each program walks its rows in BLOCK_N chunks, combining lane-wise in fp32 and reducing once at
the end, so any row length works and short rows still give each program a full tile.
"""
import math

import triton
import triton.language as tl

KIND = "reduce"
PRECISION = "fp32"
SPACE = {"ROWS_PER_PROGRAM": [1, 2, 4, 8, 16, 32], "BLOCK_N": [16, 64, 256, 1024, 4096],
         "num_warps": [1, 2, 4, 8]}
DEFAULT = {"ROWS_PER_PROGRAM": 4, "BLOCK_N": 256, "num_warps": 4}

OPS = ("sum", "mean", "max", "min")
MAX_ELEMENTS_PER_THREAD = 64  # fp32 values a thread holds before registers spill


def _reduced_axes(task):
    ndim = len(task.inputs[0].shape)
    axes = task.attr("axes") or range(ndim)
    return sorted({axis % ndim for axis in axes}) if ndim else []


def _rows_cols(task):
    shape = task.inputs[0].shape
    axes = _reduced_axes(task)
    n_cols = math.prod(shape[axes[0]:]) if axes else 1
    return task.inputs[0].numel // max(n_cols, 1), n_cols


def constraints(task, config, target):
    if task.attr("op") not in OPS:
        return f"op {task.attr('op')!r} is not one of {', '.join(OPS)}"
    if task.inputs[0].dtype not in ("float16", "bfloat16", "float32"):
        return f"dtype {task.inputs[0].dtype} is not a float kernels compute in"
    axes = _reduced_axes(task)
    if axes and axes != list(range(axes[0], len(task.inputs[0].shape))):
        return f"axes {axes} are not the trailing axes (the strided variant serves leading ones)"
    if task.inputs[0].numel == 0:
        return "empty tensor"
    tile = config["ROWS_PER_PROGRAM"] * config["BLOCK_N"]
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
def _reduce_rows(x_ptr, y_ptr, n_rows, n_cols, OP: tl.constexpr, IDENTITY: tl.constexpr,
                 BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_starts = tl.minimum(rows, n_rows - 1).to(tl.int64)[:, None] * n_cols
    acc = tl.full([ROWS, BLOCK_N], IDENTITY, tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols[None, :] < n_cols
        x = tl.load(x_ptr + row_starts + start + cols[None, :], mask=mask, other=IDENTITY,
                    eviction_policy="evict_first")
        acc = _combine(acc, x.to(tl.float32), OP)
    if OP == "max":
        result = tl.max(acc, axis=1)
    elif OP == "min":
        result = tl.min(acc, axis=1)
    else:
        result = tl.sum(acc, axis=1)
    if OP == "mean":
        result = result / n_cols
    tl.store(y_ptr + rows, result.to(y_ptr.dtype.element_ty), mask=rows < n_rows)


def launch(task, config, inputs, outputs):
    n_rows, n_cols = _rows_cols(task)
    op = task.attr("op")
    identity = {"max": -math.inf, "min": math.inf}.get(op, 0.0)
    rows_per_program = config["ROWS_PER_PROGRAM"]
    _reduce_rows[(triton.cdiv(n_rows, rows_per_program),)](
        inputs[0], outputs[0], n_rows, n_cols, OP=op, IDENTITY=identity, BLOCK_N=config["BLOCK_N"],
        ROWS=rows_per_program, num_warps=config["num_warps"])
