"""Linear: real signature plus fake-only keyword arguments that set its simulated cost.

forward: `cpu_ns` of host work (busy-wait), then `launches` kernel launches of `kernel_ns` each
         (on CUDA tensors: cudaLaunchKernel on the stand-in runtime; on CPU tensors the kernel time
         is spent as host work instead).
backward (recorded into the output; run by the native engine): `bwd_cpu_ns` of host work and
         `bwd_launches` kernels of `kernel_ns` each.
path:    where the forward's kernels go: None (torch._C.LAUNCH_PATH, default the runtime),
         "runtime", "vendor" (fakeblas_gemm in the vendor library: cuBLAS's shape) or "triton".
"""

from .module import Module, Parameter
from ... import _C


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *,
                 cpu_ns=200_000, launches=2, kernel_ns=100_000, bwd_cpu_ns=300_000, bwd_launches=4,
                 path=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(4 * in_features * out_features, device or "cpu")
        if bias:
            self.bias = Parameter(4 * out_features, device or "cpu")
        self.cpu_ns, self.launches, self.kernel_ns = cpu_ns, launches, kernel_ns
        self.bwd_cpu_ns, self.bwd_launches = bwd_cpu_ns, bwd_launches
        self.path = path

    def forward(self, input):
        _C.spin_ns(self.cpu_ns)
        if input.device == "cuda":
            for _ in range(self.launches):
                _C.launch_kernel(self.kernel_ns, self.path)
        else:
            _C.spin_ns(self.launches * self.kernel_ns)
        batch = input.shape[0] if input.shape else 1
        out = input._derive((batch, self.out_features), 4 * batch * self.out_features,
                            self.bwd_cpu_ns, self.bwd_launches, self.kernel_ns)
        return out




class Conv2d(Module):
    """Conv2d whose forward runs `launches` kernels through the vendor library's convolution
    (fakeblas_conv: cuLaunchKernelEx, cuDNN's shape) after `cpu_ns` of host work; backward as
    Linear's (the native engine)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True, *,
                 cpu_ns=200_000, launches=2, kernel_ns=100_000, bwd_cpu_ns=300_000, bwd_launches=4):
        super().__init__()
        self.weight = Parameter(4 * in_channels * out_channels * kernel_size * kernel_size, "cpu")
        self.out_channels = out_channels
        self.cpu_ns, self.launches, self.kernel_ns = cpu_ns, launches, kernel_ns
        self.bwd_cpu_ns, self.bwd_launches = bwd_cpu_ns, bwd_launches

    def forward(self, input):
        _C.spin_ns(self.cpu_ns)
        if input.device == "cuda":
            _C.conv_kernels(self.launches, self.kernel_ns)
        else:
            _C.spin_ns(self.launches * self.kernel_ns)
        return input._derive(input.shape, input.nbytes, self.bwd_cpu_ns, self.bwd_launches, self.kernel_ns)
