"""Ground-truth scenario driver_paths_mixed: every step launches through all three driver paths --
the Linear forwards through the vendor library (libfakeblasLt: its own cuGetProcAddress'd
cuLaunchKernel), one torch.compile'd elementwise module through the Triton launcher (dlsym'd
cuLaunchKernelEx), everything else (ReLU, loss, backward, optimizer) through the runtime
(cudaLaunchKernel -> cuLaunchKernel). Per step the truth's launches_by_path has all three.
Run it once more with FAKECUDA_PROCADDR=internal in the environment for the internal-pointer shape.
See tests/README.md; usage: python driver_paths_mixed.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=50,
    batch_size=2,
    getitem_ns=200000,
    kernel_ns=1000000,
    layer_launches=2,
    bwd_launches=4,
    opt_launches=2,
    launch_path="mixed",
    verdict="gpu_bound",
)

if __name__ == "__main__":
    groundtruth.run("driver_paths_mixed", CONFIG)
