@triton.jit
def _load_rows(x_ptr, first_row, n_rows, n_cols, OTHER: tl.constexpr, BLOCK_N: tl.constexpr,
               ROWS: tl.constexpr, EVICTION: tl.constexpr):
    """Rows first_row .. first_row + ROWS - 1 as fp32 [ROWS, BLOCK_N] (columns past the row = OTHER),
    their offsets, and the mask a store of them needs. Rows past the end re-read the last row
    (never stored), so no lane computes on padding alone (an all -inf softmax row would be NaN)."""
    rows = first_row + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols[None, :] < n_cols
    offsets = tl.minimum(rows, n_rows - 1).to(tl.int64)[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=col_ok, other=OTHER, eviction_policy=EVICTION).to(tl.float32)
    return x, offsets, (rows[:, None] < n_rows) & col_ok
