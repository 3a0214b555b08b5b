"""nn.Module with torch's call path: __call__ = _wrapped_call_impl -> _call_impl -> forward."""
from collections import OrderedDict

from ..._tensor import Tensor


class Parameter(Tensor):
    def __init__(self, nbytes=4, device="cpu"):
        super().__init__((max(nbytes // 4, 1),), device, nbytes, requires_grad=True)


class Module:
    def __init__(self):
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_compiled_call_impl", None)
        object.__setattr__(self, "_backward_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, Parameter):
            self._parameters[name] = value
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def _wrapped_call_impl(self, *args, **kwargs):
        if self._compiled_call_impl is not None:
            return self._compiled_call_impl(*args, **kwargs)
        else:
            return self._call_impl(*args, **kwargs)

    def _call_impl(self, *args, **kwargs):
        forward_call = self.forward
        if not (self._backward_hooks or self._forward_hooks or self._forward_pre_hooks):
            return forward_call(*args, **kwargs)
        for hook in self._forward_pre_hooks.values():
            hook(self, args)
        result = forward_call(*args, **kwargs)
        for hook in self._forward_hooks.values():
            hook(self, args, result)
        return result

    __call__ = _wrapped_call_impl

    def children(self):
        return iter(self._modules.values())

    def modules(self):
        yield self
        for m in self._modules.values():
            yield from m.modules()

    def parameters(self, recurse=True):
        for m in (self.modules() if recurse else [self]):
            yield from m._parameters.values()

    def to(self, dev, *args, **kwargs):
        d = dev if isinstance(dev, str) else getattr(dev, "type", str(dev))
        d = d.split(":")[0]
        for m in self.modules():
            for p in m._parameters.values():
                p.device = d
        return self

    def cuda(self):
        return self.to("cuda")

    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            p.grad = None

    def register_forward_hook(self, hook):
        self._forward_hooks[len(self._forward_hooks)] = hook
