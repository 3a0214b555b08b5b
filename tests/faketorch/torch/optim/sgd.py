"""SGD. Fake-only keyword arguments set the simulated cost of one step: `cpu_ns` of host work and
`launches` kernel launches of `kernel_ns` each (when the parameters are on CUDA; on CPU the kernel
time is host work)."""
from .optimizer import Optimizer, _use_grad_for_differentiable
from .. import _C


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None,
                 cpu_ns=300_000, launches=3, kernel_ns=50_000):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach,
                        differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        self.cpu_ns, self.launches, self.kernel_ns = cpu_ns, launches, kernel_ns

    @_use_grad_for_differentiable
    def step(self, closure=None):
        loss = None
        if closure is not None:
            loss = closure()
        on_cuda = any(p.device == "cuda" for g in self.param_groups for p in g["params"])
        _C.spin_ns(self.cpu_ns)
        if on_cuda:
            for _ in range(self.launches):
                _C.launch_kernel(self.kernel_ns)
        else:
            _C.spin_ns(self.launches * self.kernel_ns)
        return loss
