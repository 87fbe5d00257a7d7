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


def constraints(task, config, target):
    if task.dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    return None
