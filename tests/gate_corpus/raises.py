# expect: compile_error: illegal memory access
# Raises inside launch (caught when the backend records its launches, before any timing).
# include: softmax_core


def launch(task, config, inputs, outputs):
    raise RuntimeError("illegal memory access (simulated)")
