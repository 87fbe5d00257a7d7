# expect: runtime_error: worker process died
# Reads an illegal address: on a GPU the context is lost, in the interpreter the process dies.
# include: softmax_core


@triton.jit
def _wild_read(x_ptr, y_ptr, distance, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    far = x_ptr + distance + offs  # far outside any allocation: an illegal address
    tl.store(y_ptr + offs, tl.load(far))


def launch(task, config, inputs, outputs):
    _wild_read[(1,)](inputs[0], outputs[0], 1 << 40, BLOCK=16)
