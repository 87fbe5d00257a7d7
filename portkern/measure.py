"""The measurement harness every backend shares: warm-up, rotating inputs, median of many runs.

Backends only provide `time_once` (device events behind a spin kernel on GPUs, so launch cost is
not counted; a host clock on CPUs) or, for simulated hardware, `modeled_seconds`. How the times
were taken is recorded with them.
"""
from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from threadpoolctl import ThreadpoolController

from .backends.base import Backend, ProducingProgram, Program
from .search.records import Measurement
from .tasks import Task
from .verify import _poisoned, make_inputs


@dataclass(frozen=True)
class MeasureOptions:
    warmup: int = 3
    repeats: int = 30
    input_sets: int = 3  # rotated so caches do not flatter a kernel whose inputs fit on chip
    max_seconds: float = 2.0  # stop repeating once this much time was spent timing


@functools.cache
def _blas() -> ThreadpoolController:
    """The BLAS libraries loaded in this process (found once: it walks the process's libraries)."""
    return ThreadpoolController()


def one_blas_thread() -> AbstractContextManager[Any]:
    """numpy's BLAS on one thread while kernels are timed in this process or beside it. OpenBLAS's
    threads spin ~0.1 s after each call (a reference's matmul, the gate's error norms, the
    sampler's arithmetic between trials), and a CPU kernel timed meanwhile shares the cores with
    them: on a 2-core host every parallel TVM kernel measured in 4 ms scheduler ticks (a GEMM
    4.0 ms instead of 0.39), and the search kept serial kernels that lose to onnxruntime."""
    return _blas().limit(limits=1, user_api="blas")


_last_inputs: dict[tuple[int, str, int, int], list[list[Any]]] = {}


def device_inputs(backend: Backend, task: Task, sets: int, seed: int = 7) -> list[list[Any]]:
    """Random input sets on the device. The last task's are kept: a search times dozens of
    candidates of one task in a row, and drawing a large GEMM's inputs costs a second each time
    (a kernel that writes its inputs never gets here: the gate rejects it first)."""
    key = (id(backend), task.key, sets, seed)
    if key not in _last_inputs:
        _last_inputs.clear()
        _last_inputs[key] = [[backend.to_device(a) for a in make_inputs(task, seed + i, "normal")]
                             for i in range(sets)]
    return _last_inputs[key]


def time_program(backend: Backend, program: Program, task: Task,
                 options: MeasureOptions = MeasureOptions(),
                 inputs: Sequence[list[Any]] | None = None) -> Measurement:
    modeled = backend.modeled_seconds(program)
    if modeled is not None:
        return Measurement(times=[modeled], method=f"simulated: {backend.name} cost model", simulated=True)
    sets = list(inputs) if inputs is not None else device_inputs(backend, task, options.input_sets)
    # a program that makes its own outputs is timed as a run calls it, with no outputs given
    run: Callable[[list[Any]], Any] = (program.produce if isinstance(program, ProducingProgram)
                                       else _into(program, [_poisoned(backend, spec) for spec in task.outputs]))
    for i in range(options.warmup):
        run(sets[i % len(sets)])
    backend.synchronize()
    times: list[float] = []
    spent = 0.0
    for i in range(options.repeats):
        current = sets[i % len(sets)]
        elapsed = backend.time_once(lambda: run(current))
        times.append(elapsed)
        spent += elapsed
        if spent > options.max_seconds and len(times) >= 5:
            break
    method = (f"{backend.name}: median of {len(times)} runs after {options.warmup} warm-up, "
              f"{len(sets)} rotating input sets, each run timed alone ({backend.timing_method})")
    return Measurement(times=times, method=method)


@dataclass(frozen=True)
class KernelTime:
    kernel: str  # the kernel's name as the profiler reports it
    calls_per_run: float
    device_us_per_run: float


def kernel_device_times(run: Callable[[], Any], runs: int = 3, warmup: int = 1) -> list[KernelTime]:
    """Device time of each CUDA kernel `run` launches (CUDA graph replays included), per run,
    longest first. Wall-clock timing gives one number for a run; this says which kernel it went to,
    and a kernel's time inside a model, which need not be its time alone (torch profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            run()
        torch.cuda.synchronize()
    times = [KernelTime(event.key, event.count / runs, event.device_time_total / runs)
             for event in prof.key_averages() if event.device_time_total > 0]
    return sorted(times, key=lambda time: -time.device_us_per_run)


def _into(program: Program, outputs: list[Any]) -> Callable[[list[Any]], None]:
    """The program as one call on its inputs, writing these outputs."""
    return lambda inputs: program(inputs, outputs)
