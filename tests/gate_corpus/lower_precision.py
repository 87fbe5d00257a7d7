# expect: rejected: relative L2 error
# Declares fp32 but rounds through fp16 (like TF32 delivered for fp32).
# include: softmax_core


@triton.jit
def _softmax_fp16(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=ok, other=-float("inf")).to(tl.float16)
    e = tl.exp((x - tl.max(x, axis=0)).to(tl.float32)).to(tl.float16)
    tl.store(y_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(tl.float32), mask=ok)


def launch(task, config, inputs, outputs):
    rows, cols = _rows_cols(task)
    _softmax_fp16[(rows,)](inputs[0], outputs[0], cols, BLOCK=triton.next_power_of_2(cols))
