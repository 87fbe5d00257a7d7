# --- included from _activation.py: the fused epilogue's activations, on fp32 tiles, and its residual ---
def _residual_problem(task):
    """Why the task's residual cannot be read with the output's indices, or None (before compiling)."""
    if task.attr("residual", False) and task.inputs[-1].shape != task.outputs[0].shape:
        return f"residual {task.inputs[-1].shape} must have the output's shape {task.outputs[0].shape}"
    return None


@triton.jit
def _sigmoid(x):
    z = tl.exp(-tl.abs(x))  # never overflows
    return tl.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))


@triton.jit
def _tanh(x):
    # from e^-2|x| (never overflows); libdevice's tanh is outside the kernel contract
    z = tl.exp(-2.0 * tl.abs(x))
    magnitude = (1.0 - z) / (1.0 + z)
    return tl.where(x >= 0, magnitude, -magnitude)


@triton.jit
def _erf(x):
    # Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, 5e-7 in fp32): one exp and one division
    # where libdevice's erf takes twice the instructions and registers, which in a GEMM
    # epilogue run after the main loop (measured on an H200: +48 us on a 34 us GEMM, spilling)
    t = 1.0 / (1.0 + 0.3275911 * tl.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    magnitude = 1.0 - poly * tl.exp(-x * x)
    return tl.where(x >= 0, magnitude, -magnitude)


@triton.jit
def _activate(x, ACTIVATION: tl.constexpr):
    """The activations partition.py recognises, on an fp32 tile."""
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "relu6":
        x = tl.minimum(tl.maximum(x, 0.0), 6.0)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + _erf(x * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        x = 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    elif ACTIVATION == "silu":
        x = x * _sigmoid(x)
    elif ACTIVATION == "sigmoid":
        x = _sigmoid(x)
    elif ACTIVATION == "tanh":
        x = _tanh(x)
    return x
