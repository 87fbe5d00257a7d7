# expect: ok
# A plain correct softmax: the gate must accept it.
# include: softmax_core


def launch(task, config, inputs, outputs):
    rows, cols = _rows_cols(task)
    _softmax[(rows,)](inputs[0], outputs[0], cols, BLOCK=triton.next_power_of_2(cols))
