# --- included from _activation.py: the epilogue activations, on fp32 tiles ---
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
def _activate(x, ACTIVATION: tl.constexpr):
    """The activations partition.py recognises, on an fp32 tile."""
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "relu6":
        x = tl.minimum(tl.maximum(x, 0.0), 6.0)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        x = 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    elif ACTIVATION == "silu":
        x = x * _sigmoid(x)
    elif ACTIVATION == "sigmoid":
        x = _sigmoid(x)
    elif ACTIVATION == "tanh":
        x = _tanh(x)
    return x
