"""Ground-truth scenario gpu_low_util: the host side of the model is the limit (6 ms of CPU per Linear in forward and backward, 20 us kernels): the device idles most of each step while no input, copy or residual phase is large (LOW-GPU-UTILIZATION-UNEXPLAINED where NVML answers).
See tests/README.md; usage: python gpu_low_util.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=160,
    getitem_ns=100000,
    layer_cpu_ns=6000000,
    bwd_cpu_ns=6000000,
    opt_cpu_ns=1000000,
    kernel_ns=20000,
    verdict='compute_bound',
)

if __name__ == "__main__":
    groundtruth.run("gpu_low_util", CONFIG)
