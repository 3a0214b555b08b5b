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
