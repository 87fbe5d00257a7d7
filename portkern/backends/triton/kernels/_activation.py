# --- included from _activation.py: the activations of fused epilogues and elementwise chains (fp32), and the
# epilogue's residual check ---
# include: fast_math


def _residual_problem(task):
    """Why the task's residual (a GEMM's or a conv's: after the two operands and the bias) cannot be
    read with the output's indices, or None (before compiling)."""
    residual = task.inputs[2 + int(bool(task.attr("bias", False)))] if task.attr("residual", False) else None
    if residual is not None and residual.shape != task.outputs[0].shape:
        return f"residual {residual.shape} must have the output's shape {task.outputs[0].shape}"
    return None


@triton.jit
def _sigmoid(x):
    return _reciprocal(1.0 + tl.exp2(x * -1.4426950408889634))  # e^-x; where it overflows, rsqrt(inf) = 0


@triton.jit
def _gelu(x):
    """x (1 + erf(x / sqrt 2)) / 2 = max(x, 0) - |x| q / 2, with q = 1 - erf(|x| / sqrt 2) by
    Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7): poly(t) e^(-x^2 / 2), its coefficients halved.
    Half the instructions of 0.5 x (1 + erf) with the same erf (BERT's FFN GEMM 1.18-1.38x on an
    H100, h100-gemm-epilogue-activations-ab-2026-12-07), no cancellation for x < 0; libdevice's
    erf is twice that again (measured on an H200: +48 us on a 34 us GEMM, spilling)."""
    magnitude = tl.abs(x)
    t = _reciprocal(1.0 + 0.2316418882663604 * magnitude)  # 0.3275911 / sqrt 2
    half_poly = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145))))
    return tl.maximum(x, 0.0) - magnitude * half_poly * tl.exp2(x * x * -0.7213475204444817)  # e^(-x^2/2)


@triton.jit
def _gelu_tanh(x):
    """x (1 + tanh(u)) / 2 with u = sqrt(2/pi) (x + 0.044715 x^3), as x sigmoid(2u): fewer
    instructions, and no cancellation for x < 0."""
    return x * _sigmoid(x * (1.5957691216057308 + 0.07135481627260025 * x * x))


@triton.jit
def _activate(x, ACTIVATION: tl.constexpr):
    """The activations partition.py recognises, on an fp32 tile."""
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "relu6":
        x = tl.minimum(tl.maximum(x, 0.0), 6.0)
    elif ACTIVATION == "hardswish":
        x = x * tl.minimum(tl.maximum(x * 0.16666666666666666 + 0.5, 0.0), 1.0)
    elif ACTIVATION == "relu_squared":
        x = tl.maximum(x, 0.0)
        x = x * x
    elif ACTIVATION == "gelu":
        x = _gelu(x)
    elif ACTIVATION == "gelu_tanh":
        x = _gelu_tanh(x)
    elif ACTIVATION == "silu":
        x = x * _sigmoid(x)
    elif ACTIVATION == "sigmoid":
        x = _sigmoid(x)
    elif ACTIVATION == "tanh":
        x = _tanh(x)
    return x
