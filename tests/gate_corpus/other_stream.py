# expect: invalid: Stream
# Launches on a side stream so a timer on the default stream stops early.
# include: softmax_core


def launch(task, config, inputs, outputs):
    rows, cols = _rows_cols(task)
    stream = inputs[0].device.Stream()
    _softmax[(rows,)](inputs[0], outputs[0], cols, BLOCK=triton.next_power_of_2(cols))
