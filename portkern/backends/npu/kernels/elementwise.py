"""Elementwise chains, triton-ascend style: one program per vector core loops over BLOCK-element
tiles of the flattened tensors. The expression (attrs["expr"]) is compiled into the kernel as
constexpr step names and operand slots, so one source serves every expression of up to four steps
in which each step reads task inputs, any earlier step, or scalar constants (an earlier step than
the one before stays in a UB buffer of its own: rotary embeddings' x * cos + rotate(x) * sin
reads two products); `where` selects
between two scalars on a condition (an attention mask's preparation). An input may broadcast
when the axes it keeps are one run of the output's: it is read at (flat index // inner) % its size,
inner being the output's elements past that run. Repeating along the leading axes (a position
embedding or a bias added to every row) is inner = 1: each tile's DMA starts where the index lands,
so the start must stay 32-byte aligned. With inner > 1 (a value per row, (..., 1); a value per
channel, squeeze-excite's (N, C, 1, 1)) a tile spans only BLOCK / inner + 1 of its elements: one
small DMA from a 32-byte aligned window, then a broadcast pass in UB. Other expressions (other
broadcasts, casts, where between tensors) are refused in constraints().
"""
import math

import triton
import triton.language as tl

KIND = "elementwise"
PRECISION = "fp32"
SPACE = {"BLOCK": [1024, 2048, 4096, 8192, 16384], "PROGRAMS": [24, 32, 40, 48], "BUFFERS": [1, 2, 3]}
DEFAULT = {"BLOCK": 4096, "PROGRAMS": 48, "BUFFERS": 2}

ITEMSIZE = {"float16": 2, "float32": 4}
INPUT_ITEMSIZE = {**ITEMSIZE, "bool": 1}  # a condition input of `where` may be bool
MAX_STEPS = 4
MAX_INPUTS = 4
FIRST_STEP, SCALAR, NONE = 4, 7, -1  # operand slots beyond the inputs' 0..3: steps t0..t2 are 4..6
# vector passes per element (transcendentals take several)
STEP_COST = {"add": 1, "sub": 1, "mul": 1, "div": 2, "max": 1, "min": 1, "square": 1, "cube": 2,
             "sqrt": 2, "exp": 4, "log": 4, "tanh": 6, "sigmoid": 5, "relu": 1, "erf": 6, "neg": 1,
             "abs": 1, "reciprocal": 2, "gelu": 9, "gelu_tanh": 10, "where": 1}
BINARY = ("add", "sub", "mul", "div", "max", "min")
POWERS = {2.0: "square", 3.0: "cube", 0.5: "sqrt"}


def _steps(task):
    """(op, first operand slot, second slot, first scalar, second scalar) per step, or a reason."""
    steps = []
    for index, (op, *args) in enumerate(task.attr("expr", ())):
        if op == "pow":
            if isinstance(args[1], str) or float(args[1]) not in POWERS:
                return f"pow with exponent {args[1]!r} is not supported (only 2, 3, 0.5)"
            op, args = POWERS[float(args[1])], args[:1]
        if op not in STEP_COST:
            return f"expression step '{op}' is not supported by this variant"
        if op == "where":
            condition, chosen, other = args
            if not isinstance(condition, str) or isinstance(chosen, str) or isinstance(other, str):
                return "where is supported between two scalars only"
            args = [condition]
            scalar_branches = (float(chosen), float(other))
        slots, scalars = [], []
        for arg in args:
            if not isinstance(arg, str):
                slots.append(SCALAR)
                scalars.append(float(arg))
                continue
            if arg.startswith("t") and int(arg[1:]) < index:
                slots.append(FIRST_STEP + int(arg[1:]))
            elif arg.startswith("in") and int(arg[2:]) < MAX_INPUTS:
                slots.append(int(arg[2:]))
            else:
                return f"operand {arg} of step {index} is neither an input, an earlier step nor a scalar"
            scalars.append(0.0)
        slots += [NONE] * (2 - len(slots))
        scalars += [0.0] * (2 - len(scalars))
        if op == "where":  # the two branches ride in the scalar slots
            scalars = list(scalar_branches)
        steps.append((op, slots[0], slots[1], scalars[0], scalars[1]))
    return steps


def _kept_steps(steps):
    """Steps read after the step that follows them: each needs a UB buffer of its own."""
    return len({slot - FIRST_STEP for index, step in enumerate(steps) for slot in step[1:3]
                if FIRST_STEP <= slot < SCALAR and slot - FIRST_STEP != index - 1})


def _broadcast(spec, out_shape):
    """(period, inner): the input is read at (flat index // inner) % period; None when the axes it
    keeps (those of the output's size, among the output's non-1 axes) are not one contiguous run."""
    shape = (1,) * (len(out_shape) - len(spec.shape)) + tuple(spec.shape)
    if any(size not in (1, full) for size, full in zip(shape, out_shape)):
        return None
    axes = [axis for axis, full in enumerate(out_shape) if full != 1]
    kept = [index for index, axis in enumerate(axes) if shape[axis] == out_shape[axis]]
    if kept and kept != list(range(kept[0], kept[-1] + 1)):
        return None
    inner = math.prod(out_shape[axes[kept[-1]] + 1:]) if kept else 1
    return math.prod(shape), inner


def _window_bytes(block, inner, itemsize):
    """Bytes a tile of an inner > 1 input reads: the elements it spans, in a 32-byte aligned window."""
    return triton.cdiv((triton.cdiv(block, inner) + 1) * itemsize, 32) * 32 + 32


def constraints(task, config, target):
    if task.dtype not in ITEMSIZE or task.outputs[0].dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    out = task.outputs[0]
    if any(spec.dtype not in (task.dtype, "bool") for spec in task.inputs):
        return "inputs must have the output's dtype (or be a bool condition)"
    for spec in task.inputs:
        broadcast = _broadcast(spec, out.shape)
        if broadcast is None:
            return (f"input {spec.shape} broadcasts to {out.shape} other than by repeating one run of its "
                    "axes")
        period, inner = broadcast
        start_bytes = math.gcd(config["BLOCK"], period) * INPUT_ITEMSIZE[spec.dtype]
        if inner == 1 and period != out.numel and start_bytes % 32:
            return (f"a {spec.shape} input repeating every {period} elements starts BLOCK={config['BLOCK']} "
                    f"tiles at {start_bytes}-byte steps: DMA needs 32-byte aligned starts")
    if len(task.inputs) > MAX_INPUTS:
        return f"more than {MAX_INPUTS} inputs"
    steps = _steps(task)
    if isinstance(steps, str):
        return steps
    if not steps or len(steps) > MAX_STEPS:
        return f"expression has {len(steps)} steps (1 to {MAX_STEPS} supported)"
    return None


def schedule(task, config, target):
    n = task.outputs[0].numel
    block, size = config["BLOCK"], ITEMSIZE[task.dtype]
    n_tiles = triton.cdiv(n, block)
    programs = min(config["PROGRAMS"], n_tiles)
    moved = min(block, n)
    inputs = len(task.inputs)
    broadcasts = [_broadcast(spec, task.outputs[0].shape) for spec in task.inputs]
    # a repeating input's tile wraps around its end where BLOCK does not divide it: a second DMA
    wraps = sum(1 for period, inner in broadcasts if inner == 1 and period != n and period % block)
    read = sum(moved * INPUT_ITEMSIZE[spec.dtype] if inner == 1
               else _window_bytes(moved, inner, INPUT_ITEMSIZE[spec.dtype])
               for spec, (_, inner) in zip(task.inputs, broadcasts))
    steps = _steps(task)
    # + cast in and out, + a broadcast pass for each input read as a window
    cost = 2 + sum(STEP_COST[step[0]] for step in steps) + sum(inner > 1 for _, inner in broadcasts)
    return {
        "core": "vector", "programs": programs, "tiles": triton.cdiv(n_tiles, programs), "total_tiles": n_tiles,
        "buffers": config["BUFFERS"],
        "per_tile": {"gm_to_ub": read, "ub_to_gm": moved * ITEMSIZE[task.outputs[0].dtype],
                     "vector_ops": block * cost},
        "transfers": {"gm_to_ub": inputs + wraps},
        "live": {"ub": config["BUFFERS"] * (inputs + 1) * block * size + (2 + _kept_steps(steps)) * block * 4},
        "tails": {"ub": [block * size]},
        "gm_alignment": min((block * size) & -(block * size), 512),
        "footprint_bytes": (inputs + 1) * n * size, "vector_op_bytes": 4,
    }


@triton.jit
def _operand(SLOT: tl.constexpr, x0, x1, x2, x3, t0, t1, t2, scalar, BLOCK: tl.constexpr):
    if SLOT == 0:
        value = x0
    elif SLOT == 1:
        value = x1
    elif SLOT == 2:
        value = x2
    elif SLOT == 3:
        value = x3
    elif SLOT == 4:
        value = t0
    elif SLOT == 5:
        value = t1
    elif SLOT == 6:
        value = t2
    else:
        value = tl.full((BLOCK,), scalar, tl.float32)
    return value


@triton.jit
def _step(OP: tl.constexpr, A: tl.constexpr, B: tl.constexpr, x0, x1, x2, x3, t0, t1, t2, scalar_a, scalar_b,
          BLOCK: tl.constexpr):
    a = _operand(A, x0, x1, x2, x3, t0, t1, t2, scalar_a, BLOCK)
    b = _operand(B, x0, x1, x2, x3, t0, t1, t2, scalar_b, BLOCK)
    if OP == "add":
        y = a + b
    elif OP == "sub":
        y = a - b
    elif OP == "mul":
        y = a * b
    elif OP == "div":
        y = a / b
    elif OP == "max":
        y = tl.maximum(a, b)
    elif OP == "min":
        y = tl.minimum(a, b)
    elif OP == "square":
        y = a * a
    elif OP == "cube":
        y = a * a * a
    elif OP == "sqrt":
        y = tl.sqrt(a)
    elif OP == "exp":
        y = tl.exp(a)
    elif OP == "log":
        y = tl.log(a)
    elif OP == "tanh":
        y = 2.0 * tl.sigmoid(2.0 * a) - 1.0
    elif OP == "sigmoid":
        y = tl.sigmoid(a)
    elif OP == "relu":
        y = tl.maximum(a, 0.0)
    elif OP == "erf":
        y = tl.erf(a)
    elif OP == "neg":
        y = -a
    elif OP == "abs":
        y = tl.abs(a)
    elif OP == "reciprocal":
        y = 1.0 / a
    elif OP == "where":
        y = tl.where(a != 0.0, scalar_a, b)
    elif OP == "gelu":
        y = 0.5 * a * (1.0 + tl.erf(a * 0.7071067811865476))
    else:  # gelu_tanh
        y = 0.5 * a * (1.0 + 2.0 * tl.sigmoid(1.5957691216057308 * (a + 0.044715 * a * a * a)) - 1.0)
    return y


@triton.jit
def _tile(x_ptr, offsets, inside, period, inner, REPEATS: tl.constexpr):
    """One input's tile in fp32; a broadcast input is read at (offsets // inner) % its size."""
    if REPEATS:
        offsets = offsets // inner % period
    return tl.load(x_ptr + offsets, mask=inside, other=1.0).to(tl.float32)


@triton.jit
def _elementwise_blocks(x0_ptr, x1_ptr, x2_ptr, x3_ptr, out_ptr, n, p0, p1, p2, p3, i0, i1, i2, i3,
                        s0a, s0b, s1a, s1b, s2a, s2b, s3a, s3b,
                        R0: tl.constexpr, R1: tl.constexpr, R2: tl.constexpr, R3: tl.constexpr,
                        OP0: tl.constexpr, A0: tl.constexpr, B0: tl.constexpr,
                        OP1: tl.constexpr, A1: tl.constexpr, B1: tl.constexpr,
                        OP2: tl.constexpr, A2: tl.constexpr, B2: tl.constexpr,
                        OP3: tl.constexpr, A3: tl.constexpr, B3: tl.constexpr,
                        N_INPUTS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    num_cores = tl.num_programs(0)
    for block in range(pid, tl.cdiv(n, BLOCK), num_cores):
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        x0 = _tile(x0_ptr, offsets, inside, p0, i0, R0)
        x1 = x0
        x2 = x0
        x3 = x0
        if N_INPUTS > 1:
            x1 = _tile(x1_ptr, offsets, inside, p1, i1, R1)
        if N_INPUTS > 2:
            x2 = _tile(x2_ptr, offsets, inside, p2, i2, R2)
        if N_INPUTS > 3:
            x3 = _tile(x3_ptr, offsets, inside, p3, i3, R3)
        # a step's slots name only earlier steps (_steps), so the x0 placeholders are never read
        t0 = _step(OP0, A0, B0, x0, x1, x2, x3, x0, x0, x0, s0a, s0b, BLOCK)
        value = t0
        if OP1 != "":
            t1 = _step(OP1, A1, B1, x0, x1, x2, x3, t0, x0, x0, s1a, s1b, BLOCK)
            value = t1
            if OP2 != "":
                t2 = _step(OP2, A2, B2, x0, x1, x2, x3, t0, t1, x0, s2a, s2b, BLOCK)
                value = t2
                if OP3 != "":
                    value = _step(OP3, A3, B3, x0, x1, x2, x3, t0, t1, t2, s3a, s3b, BLOCK)
        tl.store(out_ptr + offsets, value.to(out_ptr.dtype.element_ty), mask=inside)


def launch(task, config, inputs, outputs):
    steps = _steps(task)
    steps += [("", NONE, NONE, 0.0, 0.0)] * (MAX_STEPS - len(steps))
    n = task.outputs[0].numel
    pointers = list(inputs) + [inputs[0]] * (MAX_INPUTS - len(inputs))
    scalars = [value for step in steps for value in step[3:]]
    ops = {f"{name}{index}": step[position] for index, step in enumerate(steps)
           for position, name in ((0, "OP"), (1, "A"), (2, "B"))}
    broadcasts = [_broadcast(spec, task.outputs[0].shape) for spec in task.inputs]
    broadcasts += [(n, 1)] * (MAX_INPUTS - len(broadcasts))
    repeats = {f"R{index}": broadcast != (n, 1) for index, broadcast in enumerate(broadcasts)}
    programs = min(config["PROGRAMS"], triton.cdiv(n, config["BLOCK"]))
    _elementwise_blocks[(programs,)](*pointers, outputs[0], n, *(period for period, _ in broadcasts),
                                     *(inner for _, inner in broadcasts), *scalars, **ops, **repeats,
                                     N_INPUTS=len(inputs), BLOCK=config["BLOCK"])
