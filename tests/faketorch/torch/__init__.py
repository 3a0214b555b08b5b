"""A tiny stand-in for the `torch` package (tests only; use with PYTHONPATH=tests/faketorch).

It mimics real torch exactly where traceml-daemon's probes look: the DataLoader iterator's
`__next__` (wrapped in record_function), nn.Module.__call__ = _wrapped_call_impl -> _call_impl,
Optimizer.step wrapped by profile_hook_step, Tensor.backward -> torch.autograd.backward -> the
native autograd engine, and CUDA work through libcudart (the stand-in runtime).
Everything else is fake: tensors carry sizes, not numbers.
"""
from . import _C
from ._tensor import Tensor, tensor, empty, randn, zeros, ones, device
from . import autograd
from . import cuda
from . import nn
from . import optim
from . import utils
from .utils import data as _data  # noqa: F401  (torch.utils.data is importable as an attribute)

__version__ = "0.0.0+faketorch"
float32 = "float32"


def manual_seed(seed):
    return None


def no_grad():
    return autograd.no_grad()


def set_kernel_ns(ns):
    """Simulated duration of the kernels the calling thread launches from now on (fake only)."""
    _C.set_kernel_ns(ns)


def matmul(a, b, *, kernels=1, kernel_ns=50_000):
    """A GEMM through the vendor library (fakeblas_gemm: cuLaunchKernel via its own runtime copy),
    as real torch.matmul goes through cuBLAS. Fake-only keywords: kernels, kernel_ns."""
    if getattr(a, "device", "cpu") == "cuda":
        _C.check(_C.blas().fakeblas_gemm(int(kernels), int(kernel_ns), None), "fakeblas_gemm")
    else:
        _C.spin_ns(kernels * kernel_ns)
    shape = (a.shape[0], b.shape[-1]) if len(a.shape) > 1 and len(b.shape) > 1 else a.shape
    return a._derive(shape, a.nbytes, 0, kernels, kernel_ns)


class _Compiled:
    """What torch.compile returns for a function: calling it runs the function with every kernel
    it launches going through the Triton launcher (faketriton_launch: dlsym'd cuLaunchKernelEx),
    as inductor replaces the ops by generated Triton kernels."""

    def __init__(self, fn):
        self._orig_fn = fn
        self.__name__ = getattr(fn, "__name__", "compiled")
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        prev = getattr(_C._tls, "path", None)
        _C._tls.path = "triton"
        try:
            return self._orig_fn(*args, **kwargs)
        finally:
            _C._tls.path = prev


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None,
            disable=False):
    """torch.compile: a module gets a compiled call (Module._compiled_call_impl, as
    Module.compile() does; real torch.compile(module) wraps it in an OptimizedModule), a function
    a compiled callable; either launches its kernels through the Triton launcher."""
    if model is None:
        return lambda m: compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                                 options=options, disable=disable)
    if disable:
        return model
    if isinstance(model, nn.Module):
        object.__setattr__(model, "_compiled_call_impl", _Compiled(model._call_impl))
        return model
    return _Compiled(model)


def set_launch_path(path):
    """Fake only: where kernels go ("runtime", "vendor", "triton"); see torch._C.set_launch_path."""
    _C.set_launch_path(path)
