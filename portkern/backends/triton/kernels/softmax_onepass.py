"""Softmax over the last axis in one pass: each program holds ROWS_PER_PROGRAM whole rows in registers.

The data is read once and written once (the floor for this op), statistics in fp32. BLOCK_N is
the row length rounded up to a power of two, so this variant serves rows that fit in registers;
the online variant takes longer ones. EVICTION is the cache hint on the streaming load ('' = none).
"""
import triton
import triton.language as tl

KIND = "softmax"
PRECISION = "fp32"
SPACE = {"ROWS_PER_PROGRAM": [1, 2, 4, 8, 16], "num_warps": [1, 2, 4, 8, 16],
         "EVICTION": ["evict_first", "evict_last", ""]}
DEFAULT = {"ROWS_PER_PROGRAM": 1, "num_warps": 4, "EVICTION": ""}

# include: rowwise
# include: softmax_tile


def constraints(task, config, target):
    return _whole_rows_reason(task, config, target)


@triton.jit
def _softmax_rows(x_ptr, y_ptr, n_rows, n_cols, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                  EVICTION: tl.constexpr):
    _softmax_tile(x_ptr, y_ptr, tl.program_id(0) * ROWS, n_rows, n_cols, BLOCK_N, ROWS, EVICTION)


def launch(task, config, inputs, outputs):
    n_rows, n_cols = _rows_cols(task)
    rows_per_program = config["ROWS_PER_PROGRAM"]
    _softmax_rows[(triton.cdiv(n_rows, rows_per_program),)](
        inputs[0], outputs[0], n_rows, n_cols, BLOCK_N=triton.next_power_of_2(n_cols),
        ROWS=rows_per_program, EVICTION=config["EVICTION"], num_warps=config["num_warps"])
