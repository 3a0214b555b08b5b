"""Loads the native halves: the stand-in libcudart and libtorch_{cpu,python}.so (ctypes).

Library locations (built by tests/build.sh):
  FAKECUDA_LIB         default <repo>/tests/build/fakecuda/libcudart.so.12
  FAKETORCH_LIB_DIR    default <repo>/tests/build/faketorch/torch/lib
  FAKETORCH_LAZY_CUDA  if "1", libcudart is loaded at the first CUDA use instead of at import
                       (to exercise "library mapped after attach").
  FAKEBLAS_LIB         default <repo>/tests/build/fakecuda/libfakeblasLt.so.13 (the vendor library:
                       loaded at its first use, like cuBLAS at the first GEMM)
  FAKETRITON_LIB       default <repo>/tests/build/fakecuda/libfaketriton_launcher.so (loaded at the
                       first compiled call)
  FAKETORCH_LAUNCH_PATH  runtime (default) | vendor | triton: where _C.launch_kernel's kernels (and the
                       autograd engine's) go; set_launch_path() changes it
"""
import ctypes
import os
import threading

_TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUDART_PATH = os.environ.get("FAKECUDA_LIB", os.path.join(_TESTS, "build", "fakecuda", "libcudart.so.12"))
BLAS_PATH = os.environ.get("FAKEBLAS_LIB", os.path.join(_TESTS, "build", "fakecuda", "libfakeblasLt.so.13"))
TRITON_PATH = os.environ.get("FAKETRITON_LIB",
                             os.path.join(_TESTS, "build", "fakecuda", "libfaketriton_launcher.so"))
LIB_DIR = os.environ.get("FAKETORCH_LIB_DIR", os.path.join(_TESTS, "build", "faketorch", "torch", "lib"))


def _missing(path):
    raise ImportError(f"faketorch: {path} is missing; build it with tests/build.sh")


_py_path = os.path.join(LIB_DIR, "libtorch_python.so")
if not os.path.exists(_py_path):
    _missing(_py_path)
_torch_python = ctypes.CDLL(_py_path)
_torch_cpu = ctypes.CDLL(os.path.join(LIB_DIR, "libtorch_cpu.so"))
_torch_python.faketorch_record_function_enter.restype = ctypes.c_void_p
_torch_python.faketorch_record_function_enter.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_torch_python.faketorch_record_function_exit.restype = None
_torch_python.faketorch_record_function_exit.argtypes = [ctypes.c_void_p]
_torch_python.faketorch_run_backward.restype = ctypes.c_int
_torch_python.faketorch_run_backward.argtypes = [ctypes.c_uint64] * 3


class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


_cudart = None
_cudart_lock = threading.Lock()


def cudart():
    """The stand-in libcudart (loaded on first call when FAKETORCH_LAZY_CUDA=1)."""
    global _cudart
    if _cudart is not None:
        return _cudart
    with _cudart_lock:
        if _cudart is None:
            if not os.path.exists(CUDART_PATH):
                _missing(CUDART_PATH)
            lib = ctypes.CDLL(CUDART_PATH)
            vp, sz = ctypes.c_void_p, ctypes.c_size_t
            lib.cudaLaunchKernel.argtypes = [vp, dim3, dim3, vp, sz, vp]
            lib.cudaMemcpyAsync.argtypes = [vp, vp, sz, ctypes.c_int, vp]
            lib.cudaMemcpy.argtypes = [vp, vp, sz, ctypes.c_int]
            lib.cudaStreamSynchronize.argtypes = [vp]
            lib.cudaMalloc.argtypes = [ctypes.POINTER(vp), sz]
            lib.cudaFree.argtypes = [vp]
            lib.cudaMallocHost.argtypes = [ctypes.POINTER(vp), sz]
            lib.cudaFreeHost.argtypes = [vp]
            lib.fakecuda_set_kernel_ns.argtypes = [ctypes.c_uint64]
            lib.fakecuda_set_kernel_ns.restype = None
            lib.fakecuda_set_bandwidth.argtypes = [ctypes.c_uint64]
            lib.fakecuda_set_bandwidth.restype = None
            lib.fakecuda_stats.argtypes = [vp, sz]
            lib.fakecuda_stats.restype = sz
            lib.fakecuda_stats_fields.restype = sz
            if _torch_cpu.faketorch_set_cudart(CUDART_PATH.encode()) != 0:
                raise ImportError(f"faketorch: cannot resolve cudaLaunchKernel in {CUDART_PATH}")
            _cudart = lib
    return _cudart


if os.environ.get("FAKETORCH_LAZY_CUDA") != "1" and os.path.exists(CUDART_PATH):
    cudart()
_torch_cpu.faketorch_set_launcher.argtypes = [ctypes.c_int, ctypes.c_char_p]


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"CUDA error {rc} in {what}")


_kernel = ctypes.c_void_p(0x7E57)  # stands in for a __global__ function's host stub address
_GRID, _BLOCK = dim3(1, 1, 1), dim3(128, 1, 1)


_ext = {}


def _ext_lib(path, names):
    lib = _ext.get(path)
    if lib is None:
        with _cudart_lock:
            lib = _ext.get(path)
            if lib is None:
                if not os.path.exists(path):
                    _missing(path)
                lib = ctypes.CDLL(path)
                for n in names:
                    fn = getattr(lib, n)
                    fn.argtypes = [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_void_p]
                    fn.restype = ctypes.c_int
                _ext[path] = lib
    return lib


def blas():
    """The stand-in vendor library (libfakeblasLt.so.13), loaded at its first use."""
    return _ext_lib(BLAS_PATH, ("fakeblas_gemm", "fakeblas_conv"))


def triton():
    """The Triton-shape launcher (libfaketriton_launcher.so), loaded at its first use."""
    return _ext_lib(TRITON_PATH, ("faketriton_launch", "faketriton_launch_static"))


PATHS = ("runtime", "vendor", "triton")
LAUNCH_PATH = os.environ.get("FAKETORCH_LAUNCH_PATH", "runtime")
_tls = threading.local()  # .path: set while a torch.compile'd callable runs (its kernels are Triton's)


def set_launch_path(path):
    """Where kernels of launch_kernel() and of the autograd engine go: "runtime" (cudaLaunchKernel
    on the stand-in libcudart), "vendor" (fakeblas_gemm: cuBLAS's shape, cuLaunchKernel through its
    own cuGetProcAddress) or "triton" (faketriton_launch: dlsym'd cuLaunchKernelEx)."""
    global LAUNCH_PATH
    if path not in PATHS:
        raise ValueError(f"launch path {path!r} not in {PATHS}")
    cudart()
    lib = {"runtime": None, "vendor": BLAS_PATH, "triton": TRITON_PATH}[path]
    if lib:
        blas() if path == "vendor" else triton()
    if _torch_cpu.faketorch_set_launcher(PATHS.index(path), lib.encode() if lib else None) != 0:
        raise RuntimeError(f"faketorch: cannot route the engine's kernels to {lib}")
    LAUNCH_PATH = _routed[0] = path


_routed = ["runtime"]  # where the native engine's kernels go now


def launch_kernel(ns, path=None):
    """One kernel of `ns`: through the runtime, the vendor library or the Triton launcher (`path`,
    else the compiled-call override, else LAUNCH_PATH)."""
    path = path or getattr(_tls, "path", None) or LAUNCH_PATH
    if path == "vendor":
        check(blas().fakeblas_gemm(1, int(ns), None), "fakeblas_gemm")
    elif path == "triton":
        check(triton().faketriton_launch(1, int(ns), None), "faketriton_launch")
    else:
        lib = cudart()
        lib.fakecuda_set_kernel_ns(int(ns))
        check(lib.cudaLaunchKernel(_kernel, _GRID, _BLOCK, None, 0, None), "cudaLaunchKernel")


def conv_kernels(n, ns):
    """`n` convolution kernels through the vendor library (fakeblas_conv: cuLaunchKernelEx)."""
    check(blas().fakeblas_conv(int(n), int(ns), None), "fakeblas_conv")


def set_kernel_ns(ns):
    cudart().fakecuda_set_kernel_ns(int(ns))


def record_function_enter(name):
    b = name.encode()
    return _torch_python.faketorch_record_function_enter(b, len(b))


def record_function_exit(handle):
    _torch_python.faketorch_record_function_exit(handle)


def run_backward(cpu_ns, launches, kernel_ns):
    if launches:
        cudart()
        if _routed[0] != LAUNCH_PATH:  # FAKETORCH_LAUNCH_PATH from the environment
            set_launch_path(LAUNCH_PATH)
    rc = _torch_python.faketorch_run_backward(int(cpu_ns), int(launches), int(kernel_ns))
    if rc != 0:
        raise RuntimeError("faketorch: autograd engine failed")


def cuda_stats():
    """Counters of the stand-in runtime, as a dict (field names as in fakecudart.c)."""
    names = ["version", "launch_kernel", "launch_kernel_ex", "graph_launch", "memcpy_calls",
             "memcpy_async_calls", "bytes_h2h", "bytes_h2d", "bytes_d2h", "bytes_d2d", "copies_h2d",
             "copies_d2h", "stream_sync", "device_sync", "event_sync", "event_record",
             "kernel_ns_enqueued", "kernel_ns_executed", "copy_ns_executed", "ops_enqueued",
             "ops_completed", "host_blocked_ns", "malloc_calls", "free_calls", "malloc_host_calls",
             "free_host_calls", "api_calls",
             # version 2
             "launches_runtime", "launches_library", "launches_direct", "launches_driver", "coop_launch",
             "memcpy_peer_calls", "procaddr_calls", "procaddr_internal"]
    lib = cudart()
    n = lib.fakecuda_stats_fields()
    buf = (ctypes.c_uint64 * n)()
    lib.fakecuda_stats(ctypes.cast(buf, ctypes.c_void_p), ctypes.sizeof(buf))
    return {names[i] if i < len(names) else f"field{i}": buf[i] for i in range(n)}


def spin_ns(ns):
    """Simulated CPU work: busy-wait (stays on CPU) for ns."""
    import time
    end = time.monotonic_ns() + int(ns)
    while time.monotonic_ns() < end:
        pass
