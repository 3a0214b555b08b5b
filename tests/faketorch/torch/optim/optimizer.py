"""Optimizer with torch's profiling hooks: step is wrapped (once per class) by profile_hook_step in
record_function(f"Optimizer.step#{ClassName}.step"); zero_grad runs inside
record_function(f"Optimizer.zero_grad#{ClassName}.zero_grad"), as in torch 2.x."""
import functools
from collections import OrderedDict
from itertools import chain

import torch

_global_optimizer_pre_hooks = OrderedDict()
_global_optimizer_post_hooks = OrderedDict()


def _use_grad_for_differentiable(func):
    def _use_grad(self, *args, **kwargs):
        with torch.autograd.set_grad_enabled(self.defaults.get("differentiable", False)):
            ret = func(self, *args, **kwargs)
        return ret
    functools.update_wrapper(_use_grad, func)
    return _use_grad


class Optimizer:
    def __init__(self, params, defaults):
        self.defaults = defaults
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._patch_step_function()
        params = list(params)
        if params and not isinstance(params[0], dict):
            params = [{"params": params}]
        self.param_groups = []
        for g in params:
            g = dict(g)
            for k, v in defaults.items():
                g.setdefault(k, v)
            self.param_groups.append(g)
        self.state = {}

    def _patch_step_function(self):
        self._zero_grad_profile_name = f"Optimizer.zero_grad#{self.__class__.__name__}.zero_grad"
        hooked = getattr(self.__class__.step, "hooked", None)
        if not hooked:
            self.__class__.step = self.profile_hook_step(self.__class__.step)
            self.__class__.step.hooked = True

    @staticmethod
    def profile_hook_step(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            self, *_ = args
            profile_name = f"Optimizer.step#{self.__class__.__name__}.step"
            with torch.autograd.profiler.record_function(profile_name):
                for pre_hook in chain(_global_optimizer_pre_hooks.values(),
                                      self._optimizer_step_pre_hooks.values()):
                    pre_hook(self, args, kwargs)
                out = func(*args, **kwargs)
                self._optimizer_step_code()
                for post_hook in chain(self._optimizer_step_post_hooks.values(),
                                       _global_optimizer_post_hooks.values()):
                    post_hook(self, args, kwargs)
                return out
        return wrapper

    def _optimizer_step_code(self):
        pass

    def zero_grad(self, set_to_none=True):
        if not hasattr(self, "_zero_grad_profile_name"):
            self._patch_step_function()
        with torch.autograd.profiler.record_function(self._zero_grad_profile_name):
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None

    def step(self, closure=None):
        raise NotImplementedError
