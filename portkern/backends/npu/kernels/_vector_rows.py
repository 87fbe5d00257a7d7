"""Shared by the row-wise vector kernels (softmax, layernorm, rmsnorm): tiles of ROWS whole rows,
padded to a 32-byte aligned power of two, one program per vector core."""
ITEMSIZE = {"float16": 2, "float32": 4}


def _geometry(task, config):
    n_cols = task.inputs[0].shape[-1]
    n_rows = task.inputs[0].numel // n_cols
    itemsize = ITEMSIZE[task.dtype]
    block_n = max(triton.next_power_of_2(n_cols), 32 // itemsize)
    n_tiles = triton.cdiv(n_rows, config["ROWS"])
    programs = min(config["PROGRAMS"], n_tiles)
    return n_rows, n_cols, itemsize, block_n, n_tiles, programs


RESIDUAL_OPS_PER_ELEMENT = 4  # the norm rounded to the output's dtype and back, the residual cast, the add


def _residual_operands(task, inputs, outputs):
    """(a norm's params, the residual's buffer, whether there is one): a post-norm's residual is its
    last input; the output stands in otherwise (never read)."""
    residual = bool(task.attr("residual", False))
    return (inputs[1:-1] if residual else inputs[1:]), (inputs[-1] if residual else outputs[0]), residual


@triton.jit
def _plus_residual(y, out_ptr, residual_ptr, offsets, inside, RESIDUAL: tl.constexpr):
    """y + the residual tile at the same offsets, y first rounded to the output's dtype as the
    model rounds its norm before adding; y unchanged without one."""
    if RESIDUAL:
        residual = tl.load(residual_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32) + residual
    return y


def _rows_schedule(task, config, ops_per_element, fp32_tiles, params=0, loaded_params=None):
    """The simulator's schedule of a row-wise kernel: each tile's rows into UB and back, and
    ops_per_element vector ops on every padded element. Live in UB beside the multi-buffered io
    tiles: fp32_tiles fp32 working tiles and `params` per-column fp32 vectors (gamma, beta: read
    once per core, loaded_params of them from memory, all of them by default). A norm's residual
    is a second input stream: its tiles come in beside x's, multi-buffered as they are."""
    n_rows, n_cols, itemsize, block_n, n_tiles, programs = _geometry(task, config)
    rows = config["ROWS"]
    row_bytes = n_cols * itemsize
    streams_in = 2 if task.attr("residual", False) else 1
    ops = ops_per_element + (RESIDUAL_OPS_PER_ELEMENT if streams_in == 2 else 0)
    schedule = {
        "core": "vector", "programs": programs, "tiles": triton.cdiv(n_tiles, programs),
        "total_tiles": n_tiles, "buffers": config["BUFFERS"],
        "per_tile": {"gm_to_ub": streams_in * rows * row_bytes, "ub_to_gm": rows * row_bytes,
                     "vector_ops": rows * block_n * ops},
        "live": {"ub": (config["BUFFERS"] * (streams_in + 1) * rows * block_n * itemsize
                        + fp32_tiles * rows * block_n * 4 + params * block_n * 4)},
        "tails": {"ub": [block_n * itemsize, block_n * 4]},
        "gm_alignment": min(row_bytes & -row_bytes, 512),
        "footprint_bytes": (streams_in + 1) * n_rows * row_bytes + params * row_bytes,
        "vector_op_bytes": 4,
    }
    if params:
        loaded = params if loaded_params is None else loaded_params
        schedule["setup"] = {"gm_to_ub": loaded * row_bytes, "vector_ops": params * block_n}
    return schedule


def constraints(task, config, target):
    if task.dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    return None
