"""torch.autograd: backward() goes to the native engine like real torch
(Tensor.backward -> torch.autograd.backward -> _engine_run_backward ->
Variable._execution_engine.run_backward = THPEngine_run_backward -> Engine::execute)."""
from . import profiler  # noqa: F401
from .. import _C


class _ExecutionEngine:
    def run_backward(self, tensors, grad_tensors, keep_graph, create_graph, inputs, allow_unreachable,
                     accumulate_grad):
        cpu = launches = kernel = 0
        for t in tensors:
            cpu += t._cost[0]
            launches += t._cost[1]
            kernel += t._cost[2]
        per_kernel = kernel // launches if launches else 0
        on_cuda = any(t.device == "cuda" for t in tensors)
        if not on_cuda:  # CPU graph: the "kernels" are CPU work on the calling thread
            cpu, launches, per_kernel = cpu + kernel, 0, 0
        _C.run_backward(cpu, launches, per_kernel)
        return ()


class Variable:
    _execution_engine = _ExecutionEngine()


def _engine_run_backward(t_outputs, *args, **kwargs):
    return Variable._execution_engine.run_backward(t_outputs, *args, **kwargs)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None,
             inputs=None):
    if not isinstance(tensors, (tuple, list)):
        tensors = (tensors,)
    if retain_graph is None:
        retain_graph = create_graph
    _engine_run_backward(tuple(tensors), grad_tensors, retain_graph, create_graph, inputs or (),
                         True, True)


class no_grad:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def __call__(self, fn):
        return fn


class set_grad_enabled(no_grad):
    def __init__(self, mode=True):
        self.mode = mode
