"""Softmax over the last axis for rows too long for registers: online max/sum, then a writing pass.

One program per row walks the row in BLOCK_N chunks keeping a running max and a running sum
rescaled whenever the max grows (fp32), then walks it again to write. The first walk asks the
cache to keep the row, so the second read comes from L2 while the row fits there.
"""
import triton
import triton.language as tl

KIND = "softmax"
PRECISION = "fp32"
SPACE = {"BLOCK_N": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16]}
DEFAULT = {"BLOCK_N": 1024, "num_warps": 4}

LOG2E = tl.constexpr(1.4426950408889634)
# include: rowwise


def constraints(task, config, target):
    return _row_chunks_reason(task, config, target)


@triton.jit
def _softmax_online(x_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr):
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK_N)
    row_max = tl.full([], -float("inf"), tl.float32)
    row_sum = tl.full([], 0.0, tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        x = tl.load(x_ptr + row_start + start + cols, mask=start + cols < n_cols, other=-float("inf"),
                    eviction_policy="evict_last").to(tl.float32)
        new_max = tl.maximum(row_max, tl.max(x, axis=0))
        row_sum = row_sum * tl.exp2((row_max - new_max) * LOG2E) + tl.sum(tl.exp2((x - new_max) * LOG2E), axis=0)
        row_max = new_max
    inv_sum = 1.0 / row_sum
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row_start + start + cols, mask=mask, other=-float("inf"),
                    eviction_policy="evict_first").to(tl.float32)
        y = tl.exp2((x - row_max) * LOG2E) * inv_sum
        tl.store(y_ptr + row_start + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def launch(task, config, inputs, outputs):
    n_rows, n_cols = _rows_cols(task)
    _softmax_online[(n_rows,)](inputs[0], outputs[0], n_cols, BLOCK_N=config["BLOCK_N"],
                               num_warps=config["num_warps"])
