"""torch.cuda: the few functions workloads use, over the stand-in libcudart."""
from . import _C


def is_available():
    return True


def device_count():
    import ctypes
    n = ctypes.c_int(0)
    _C.check(_C.cudart().cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
    return n.value


def synchronize(device=None):
    _C.check(_C.cudart().cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def set_bandwidth(bytes_per_s):
    """Fake only: copy bandwidth of the simulated device."""
    _C.cudart().fakecuda_set_bandwidth(int(bytes_per_s))


stats = _C.cuda_stats
