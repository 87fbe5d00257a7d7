LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _softmax_tile(x_ptr, y_ptr, first_row, n_rows, n_cols, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                  EVICTION: tl.constexpr):
    """Softmax of rows first_row .. first_row + ROWS - 1, whole rows in registers, fp32 math."""
    rows = first_row + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols[None, :] < n_cols
    # rows past the end re-read the last row (never stored) so no lane sees an all -inf row
    offsets = tl.minimum(rows, n_rows - 1).to(tl.int64)[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=col_ok, other=-float("inf"), eviction_policy=EVICTION)
    x = x.to(tl.float32)
    e = tl.exp2((x - tl.max(x, axis=1)[:, None]) * LOG2E)
    y = e * (1.0 / tl.sum(e, axis=1))[:, None]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=(rows[:, None] < n_rows) & col_ok)
