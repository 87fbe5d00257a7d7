"""Softmax over the last axis with a persistent grid: cores x PROGRAMS_PER_CORE programs loop over rows.

Each program keeps ROWS_PER_PROGRAM whole rows in registers (one read, one write, fp32 math) and
strides through the row blocks, so launch and tail costs are paid once per program and the loop
can prefetch the next block (NUM_STAGES) while the current one is reduced.
"""
import triton
import triton.language as tl

KIND = "softmax"
PRECISION = "fp32"
SPACE = {"ROWS_PER_PROGRAM": [1, 2, 4], "num_warps": [2, 4, 8, 16],
         "PROGRAMS_PER_CORE": [1, 2, 4, 8], "NUM_STAGES": [1, 2, 3], "EVICTION": ["evict_first", ""]}
DEFAULT = {"ROWS_PER_PROGRAM": 1, "num_warps": 4, "PROGRAMS_PER_CORE": 4, "NUM_STAGES": 2, "EVICTION": ""}

HOST_CORES = 2  # off the GPU (interpreter, cross-compilation): few programs, each loops over many rows

# include: rowwise
# include: softmax_tile


def constraints(task, config, target):
    reason = _whole_rows_reason(task, config, target)
    if reason is None and config["NUM_STAGES"] > 1:
        tile_bytes = config["ROWS_PER_PROGRAM"] * triton.next_power_of_2(_rows_cols(task)[1]) \
            * task.inputs[0].nbytes // task.inputs[0].numel
        if config["NUM_STAGES"] * tile_bytes > target.profile.limits.get("shared_mem_per_block", 0):
            return f"{config['NUM_STAGES']} stages of {tile_bytes} B tiles exceed shared memory"
    return reason


# include: device_cores


@triton.jit
def _softmax_persistent(x_ptr, y_ptr, n_rows, n_cols, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                        NUM_STAGES: tl.constexpr, EVICTION: tl.constexpr):
    for block in tl.range(tl.program_id(0), tl.cdiv(n_rows, ROWS), tl.num_programs(0), num_stages=NUM_STAGES):
        _softmax_tile(x_ptr, y_ptr, block * ROWS, n_rows, n_cols, BLOCK_N, ROWS, EVICTION)


def launch(task, config, inputs, outputs):
    n_rows, n_cols = _rows_cols(task)
    rows_per_program = config["ROWS_PER_PROGRAM"]
    programs = _core_count(inputs[0], HOST_CORES) * config["PROGRAMS_PER_CORE"]
    _softmax_persistent[(min(triton.cdiv(n_rows, rows_per_program), programs),)](
        inputs[0], outputs[0], n_rows, n_cols, BLOCK_N=triton.next_power_of_2(n_cols),
        ROWS=rows_per_program, NUM_STAGES=config["NUM_STAGES"], EVICTION=config["EVICTION"],
        num_warps=config["num_warps"])
