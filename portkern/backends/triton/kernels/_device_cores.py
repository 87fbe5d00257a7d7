# --- included from _device_cores.py: how many multiprocessors the GPU a tensor lives on has ---
_CORES = {}  # device index -> multiprocessors: the driver query costs ~1 ms, far more than a kernel


def _core_count(tensor, off_gpu):
    """The multiprocessors of the tensor's GPU; `off_gpu` where it has none (the interpreter, or
    tensors on the meta device while cross-compiling)."""
    if tensor.device.type in ("cpu", "meta"):
        return off_gpu
    index = tensor.device.index
    if index not in _CORES:
        _CORES[index] = triton.runtime.driver.active.utils.get_device_properties(index)["multiprocessor_count"]
    return _CORES[index]
