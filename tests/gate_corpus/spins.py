# expect: timeout: killed as hung
# Compiles, then waits at run time for a value no one writes: the kernel-run limit kills it,
# long before the trial's own limit.
# include: softmax_core


@triton.jit
def _wait_for_change(flag_ptr):
    seen = tl.load(flag_ptr)
    now = seen
    while now == seen:
        now = tl.load(flag_ptr)


def launch(task, config, inputs, outputs):
    rows, cols = _rows_cols(task)
    _wait_for_change[(1,)](inputs[0])
    _softmax[(rows,)](inputs[0], outputs[0], cols, BLOCK=triton.next_power_of_2(cols))
