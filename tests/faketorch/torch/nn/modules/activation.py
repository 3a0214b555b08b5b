from .module import Module
from ... import _C


class ReLU(Module):
    def __init__(self, inplace=False, *, kernel_ns=20_000):
        super().__init__()
        self.kernel_ns = kernel_ns

    def forward(self, input):
        if input.device == "cuda":
            _C.launch_kernel(self.kernel_ns)
        else:
            _C.spin_ns(self.kernel_ns)
        return input._derive(input.shape, input.nbytes, 0, 1, self.kernel_ns)
