"""LayerNorm over the last axis for rows too long for registers: a statistics walk, then a writing walk.

One program per row. The first walk merges per-chunk (count, mean, M2) into the row's running
statistics (_moments.py, fp32); it asks the cache to keep the row so the writing walk reads it from L2.
"""
import triton
import triton.language as tl

KIND = "layernorm"
PRECISION = "fp32"
SPACE = {"BLOCK_N": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16]}
DEFAULT = {"BLOCK_N": 1024, "num_warps": 4}

# include: rowwise
# include: moments
# include: norm_residual


def constraints(task, config, target):
    return _row_chunks_reason(task, config, target)


@triton.jit
def _layernorm_looped(x_ptr, gamma_ptr, beta_ptr, residual_ptr, y_ptr, n_cols, eps, BLOCK_N: tl.constexpr,
                      RESIDUAL: tl.constexpr):
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    cols = tl.arange(0, BLOCK_N)
    mean = tl.full([], 0.0, tl.float32)
    m2 = tl.full([], 0.0, tl.float32)
    seen = tl.full([], 0.0, tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row_start + start + cols, mask=mask, other=0.0,
                    eviction_policy="evict_last").to(tl.float32)
        mean, m2, seen = _merge_chunk(mean, m2, seen, x, mask, tl.minimum(n_cols - start, BLOCK_N).to(tl.float32))
    rstd = tl.rsqrt(m2 / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row_start + start + cols, mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        gamma = tl.load(gamma_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
        offsets = row_start + start + cols
        y = _plus_residual((x - mean) * rstd * gamma + beta, y_ptr, residual_ptr, offsets, mask, RESIDUAL)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def launch(task, config, inputs, outputs):
    n_rows, n_cols = _rows_cols(task)
    residual, has_residual = _residual_operands(task, inputs, outputs)
    _layernorm_looped[(n_rows,)](inputs[0], inputs[1], inputs[2], residual, outputs[0], n_cols,
                                 float(task.attr("eps", 1e-5)), BLOCK_N=config["BLOCK_N"], RESIDUAL=has_residual,
                                 num_warps=config["num_warps"])
