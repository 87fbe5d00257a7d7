# --- included from _gemm_tma_inplace.py: the TMA GEMM reading A and B where they are (its module sets
# DOT_PRECISION) ---
# include: gemm_tma


def constraints(task, config, target):
    return (_dot_precision_problem(task, target) or _tma_problem(task, target)
            or _tma_config_problem(task, config, target))


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    _launch_tma(task, config, p, inputs[0], p.stride_a, inputs[1], _stored_b_strides(task, p), outputs[0])
