"""torch.cuda: the few functions workloads use, over the stand-in libcudart."""
from . import _C


def is_available():
    return True


def device_count():
    import ctypes
    n = ctypes.c_int(0)
    _C.check(_C.cudart().cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
    return n.value


def _index(d):
    """A device index from an int, "cuda:1" or a torch.device (as torch's _get_device_index)."""
    from ._tensor import device as _device
    if isinstance(d, int):
        return d
    d = d if isinstance(d, _device) else _device(d)
    if d.type != "cuda" or d.index is None:
        raise ValueError(f"Expected a cuda device with a specified index or an integer, but got:{d}")
    return d.index


def set_device(device):
    """cudaSetDevice: the calling thread's current device (a negative index is ignored, as in torch).
    The simulated device's queue takes the process's current device at its first operation."""
    i = _index(device)
    if i >= 0:
        _C.check(_C.cudart().cudaSetDevice(i), "cudaSetDevice")


def current_device():
    import ctypes
    d = ctypes.c_int(0)
    _C.check(_C.cudart().cudaGetDevice(ctypes.byref(d)), "cudaGetDevice")
    return d.value


def memory_allocated(device=None):
    """Device bytes held by live tensors (exact sizes: no 512-byte rounding as in torch's allocator)."""
    from ._tensor import DEVICE_BYTES
    return DEVICE_BYTES["allocated"]


def memory_reserved(device=None):
    """Device bytes cudaMalloc'd by the caching allocator (never freed)."""
    from ._tensor import DEVICE_BYTES
    return DEVICE_BYTES["reserved"]


def synchronize(device=None):
    _C.check(_C.cudart().cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def set_bandwidth(bytes_per_s):
    """Fake only: copy bandwidth of the simulated device."""
    _C.cudart().fakecuda_set_bandwidth(int(bytes_per_s))


stats = _C.cuda_stats
