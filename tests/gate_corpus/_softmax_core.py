"""The correct softmax every corpus kernel starts from; each fixture adds its cheat or bug."""
import triton
import triton.language as tl

KIND = "softmax"
PRECISION = "fp32"
SPACE = {"BLOCK_ROWS": [1]}
DEFAULT = {"BLOCK_ROWS": 1}

@triton.jit
def _softmax(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=ok, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=ok)


@triton.jit
def _copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def _rows_cols(task):
    cols = task.inputs[0].shape[-1]
    return task.inputs[0].numel // cols, cols


def constraints(task, config, target):
    return None


