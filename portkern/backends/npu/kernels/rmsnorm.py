"""RMSNorm, triton-ascend style: one program per vector core looping over tiles of ROWS whole rows
in UB (padded to a 32-byte aligned power of two); gamma is loaded once per core.
"""
import triton
import triton.language as tl

KIND = "rmsnorm"
PRECISION = "fp32"
SPACE = {"ROWS": [1, 2, 4, 8, 16, 32], "PROGRAMS": [24, 32, 40, 48], "BUFFERS": [1, 2, 3]}
DEFAULT = {"ROWS": 4, "PROGRAMS": 48, "BUFFERS": 2}

# include: vector_rows
VECTOR_OPS_PER_ELEMENT = 6  # cast, square, sum, scale by rstd, gamma, cast back


def schedule(task, config, target):
    return _rows_schedule(task, config, VECTOR_OPS_PER_ELEMENT, fp32_tiles=1, params=1)  # x; gamma


@triton.jit
def _rmsnorm_rows(x_ptr, gamma_ptr, residual_ptr, out_ptr, n_rows, n_cols, eps, ROWS: tl.constexpr,
                  BLOCK_N: tl.constexpr, RESIDUAL: tl.constexpr):
    pid = tl.program_id(0)
    num_cores = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    gamma = tl.load(gamma_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    n_tiles = tl.cdiv(n_rows, ROWS)
    for tile in range(pid, n_tiles, num_cores):
        rows = tile * ROWS + tl.arange(0, ROWS)
        inside = (rows < n_rows)[:, None] & col_ok[None, :]
        offsets = rows[:, None] * n_cols + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        rms = tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        y = _plus_residual(x / rms[:, None] * gamma[None, :], out_ptr, residual_ptr, offsets, inside, RESIDUAL)
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=inside)


def launch(task, config, inputs, outputs):
    n_rows, n_cols, _, block_n, _, programs = _geometry(task, config)
    (gamma,), residual, has_residual = _residual_operands(task, inputs, outputs)
    _rmsnorm_rows[(programs,)](inputs[0], gamma, residual, outputs[0], n_rows, n_cols, float(task.attr("eps", 1e-6)),
                               ROWS=config["ROWS"], BLOCK_N=block_n, RESIDUAL=has_residual)

