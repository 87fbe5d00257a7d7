"""LayerNorm over the last axis in one pass: each program holds ROWS_PER_PROGRAM whole rows in registers.

x is read once and y written once; mean and variance are taken in fp32 from the centred values
held in registers (no sum-of-squares cancellation). gamma and beta are loaded once per program;
EVICTION is the cache hint on the streaming load ('' = none).
"""
import triton
import triton.language as tl

KIND = "layernorm"
PRECISION = "fp32"
SPACE = {"ROWS_PER_PROGRAM": [1, 2, 4, 8, 16], "num_warps": [1, 2, 4, 8, 16],
         "EVICTION": ["evict_first", "evict_last", ""]}
DEFAULT = {"ROWS_PER_PROGRAM": 1, "num_warps": 4, "EVICTION": ""}

# include: rowwise
# include: row_tile
# include: norm_residual


def constraints(task, config, target):
    return _whole_rows_reason(task, config, target)


@triton.jit
def _layernorm_rows(x_ptr, gamma_ptr, beta_ptr, residual_ptr, y_ptr, n_rows, n_cols, eps,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, EVICTION: tl.constexpr, RESIDUAL: tl.constexpr):
    x, offsets, store_mask = _load_rows(x_ptr, tl.program_id(0) * ROWS, n_rows, n_cols, 0.0, BLOCK_N, ROWS,
                                        EVICTION)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    mean = tl.sum(x, axis=1) / n_cols
    centred = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(centred * centred, axis=1) / n_cols + eps)
    gamma = tl.load(gamma_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = centred * rstd[:, None] * gamma[None, :] + beta[None, :]
    y = _plus_residual(y, y_ptr, residual_ptr, offsets, store_mask, RESIDUAL)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=store_mask)


def launch(task, config, inputs, outputs):
    n_rows, n_cols = _rows_cols(task)
    rows_per_program = config["ROWS_PER_PROGRAM"]
    grid = (triton.cdiv(n_rows, rows_per_program),)
    residual, has_residual = _residual_operands(task, inputs, outputs)
    _layernorm_rows[grid](inputs[0], inputs[1], inputs[2], residual, outputs[0], n_rows, n_cols,
                          float(task.attr("eps", 1e-5)), BLOCK_N=triton.next_power_of_2(n_cols),
                          ROWS=rows_per_program, EVICTION=config["EVICTION"], RESIDUAL=has_residual,
                          num_warps=config["num_warps"])
