MAX_ELEMENTS_PER_THREAD = 64  # fp32 values a thread holds before its registers spill


def _rows_cols(task):
    """The first input as rows x cols over its last axis (kernels index it as contiguous rows)."""
    shape = task.inputs[0].shape
    n_cols = shape[-1] if shape else 1
    return task.inputs[0].numel // max(n_cols, 1), n_cols


def _spill_reason(elements, config, target):
    """Why holding `elements` fp32 values per program over config's warps would spill, or None."""
    threads = config["num_warps"] * target.profile.warp_size
    if elements > MAX_ELEMENTS_PER_THREAD * threads:
        return f"{elements} elements in registers over {threads} threads would spill"
    return None


def _whole_rows_reason(task, config, target):
    """Why ROWS_PER_PROGRAM whole rows (padded to a power of two) cannot sit in registers, or None."""
    n_rows, n_cols = _rows_cols(task)
    if n_rows == 0 or n_cols == 0:
        return "empty tensor"
    return _spill_reason(config["ROWS_PER_PROGRAM"] * triton.next_power_of_2(n_cols), config, target)


def _row_chunks_reason(task, config, target):
    """Why a BLOCK_N chunk of a row cannot sit in registers, or None (any row length is walked)."""
    if task.inputs[0].numel == 0:
        return "empty tensor"
    return _spill_reason(config["BLOCK_N"], config, target)
