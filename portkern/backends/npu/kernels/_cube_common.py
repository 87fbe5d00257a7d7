# --- included from _cube_common.py: what every cube kernel shares (item sizes, the fractal, activations) ---
ITEMSIZE = {"float16": 2, "float32": 4}
ACTIVATION_VECTOR_OPS = {"none": 0, "relu": 1, "relu6": 2, "sigmoid": 4, "tanh": 5, "silu": 5, "gelu": 8,
                         "gelu_tanh": 10}


def _fractal(extent):
    """The extent rounded up to the cube's 16-element fractal."""
    return -(-extent // 16) * 16


@triton.jit
def _activate(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "relu6":
        x = tl.minimum(tl.maximum(x, 0.0), 6.0)
    elif ACTIVATION == "sigmoid":
        x = tl.sigmoid(x)
    elif ACTIVATION == "tanh":
        x = 2.0 * tl.sigmoid(2.0 * x) - 1.0
    elif ACTIVATION == "silu":
        x = x * tl.sigmoid(x)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = 0.5 * x * (1.0 + 2.0 * tl.sigmoid(2.0 * inner) - 1.0)
    return x
