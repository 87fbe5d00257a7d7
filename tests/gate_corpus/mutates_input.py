# expect: rejected: modified its inputs
# Writes its result over its input as well (in-place on a buffer it does not own).
# include: softmax_core


def launch(task, config, inputs, outputs):
    rows, cols = _rows_cols(task)
    _softmax[(rows,)](inputs[0], outputs[0], cols, BLOCK=triton.next_power_of_2(cols))
    _copy[(triton.cdiv(rows * cols, 256),)](outputs[0], inputs[0], rows * cols, BLOCK=256)
