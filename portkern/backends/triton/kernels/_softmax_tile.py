# include: row_tile
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _softmax_tile(x_ptr, y_ptr, first_row, n_rows, n_cols, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                  EVICTION: tl.constexpr):
    """Softmax of rows first_row .. first_row + ROWS - 1, whole rows in registers, fp32 math."""
    x, offsets, store_mask = _load_rows(x_ptr, first_row, n_rows, n_cols, -float("inf"), BLOCK_N, ROWS, EVICTION)
    e = tl.exp2((x - tl.max(x, axis=1)[:, None]) * LOG2E)
    y = e * (1.0 / tl.sum(e, axis=1))[:, None]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=store_mask)
