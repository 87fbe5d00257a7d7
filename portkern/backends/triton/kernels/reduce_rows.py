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

# include: rowwise
# include: reduce_combine


def _rows_reduced(task):
    axes = _reduced_axes(task)
    n_cols = math.prod(task.inputs[0].shape[axes[0]:]) if axes else 1
    return task.inputs[0].numel // n_cols, n_cols


def constraints(task, config, target):
    axes = _reduced_axes(task)
    if axes and axes != list(range(axes[0], len(task.inputs[0].shape))):
        return f"axes {axes} are not the trailing axes (the strided variant serves others)"
    return _task_reason(task) or _spill_reason(config["ROWS_PER_PROGRAM"] * config["BLOCK_N"], config, target)


@triton.jit
def _reduce_rows(x_ptr, y_ptr, n_rows, n_cols, OP: tl.constexpr, IDENTITY: tl.constexpr,
                 BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_starts = tl.minimum(rows, n_rows - 1).to(tl.int64)[:, None] * n_cols
    acc = tl.full([ROWS, BLOCK_N], IDENTITY, tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        x = tl.load(x_ptr + row_starts + start + cols[None, :], mask=start + cols[None, :] < n_cols,
                    other=IDENTITY, eviction_policy="evict_first")
        acc = _combine(acc, x.to(tl.float32), OP)
    result = _finish(acc, n_cols, 1, OP)
    tl.store(y_ptr + rows, result.to(y_ptr.dtype.element_ty), mask=rows < n_rows)


def launch(task, config, inputs, outputs):
    n_rows, n_cols = _rows_reduced(task)
    op = task.attr("op")
    rows_per_program = config["ROWS_PER_PROGRAM"]
    _reduce_rows[(triton.cdiv(n_rows, rows_per_program),)](
        inputs[0], outputs[0], n_rows, n_cols, OP=op, IDENTITY=_identity(op), BLOCK_N=config["BLOCK_N"],
        ROWS=rows_per_program, num_warps=config["num_warps"])
