# expect: rejected: unwritten
# Launches a kernel that never stores: the output keeps whatever memory held (poisoned: NaN).
# include: softmax_core


@triton.jit
def _reads_only(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n)  # touches the input, never stores the output


def launch(task, config, inputs, outputs):
    rows, cols = _rows_cols(task)
    _reads_only[(triton.cdiv(rows * cols, 256),)](inputs[0], outputs[0], rows * cols, BLOCK=256)
