# expect: compile_error
# Does not compile (wrong Triton).
# include: softmax_core


@triton.jit
def _broken(x_ptr, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), tl.undefined_function(BLOCK))


def launch(task, config, inputs, outputs):
    _broken[(1,)](outputs[0], BLOCK=16)
