# expect: rejected: relative L2 error
# Caches its answer by shape: a second seed with the same shape gets the first answer.
# include: softmax_core


_CACHE = {}


def launch(task, config, inputs, outputs):
    rows, cols = _rows_cols(task)
    key = tuple(inputs[0].shape)
    if key in _CACHE:
        _copy[(triton.cdiv(rows * cols, 256),)](_CACHE[key], outputs[0], rows * cols, BLOCK=256)
        return
    _softmax[(rows,)](inputs[0], outputs[0], cols, BLOCK=triton.next_power_of_2(cols))
    _CACHE[key] = outputs[0]
