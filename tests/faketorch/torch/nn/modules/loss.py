from .module import Module
from ... import _C


class MSELoss(Module):
    def __init__(self, reduction="mean", *, kernel_ns=20_000):
        super().__init__()
        self.kernel_ns = kernel_ns

    def forward(self, input, target):
        if input.device == "cuda":
            _C.launch_kernel(self.kernel_ns)
        else:
            _C.spin_ns(self.kernel_ns)
        return input._derive((), 4, 0, 1, self.kernel_ns)
