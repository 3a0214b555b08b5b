"""Ground-truth scenario driver_paths_vendor: every model, backward and optimizer kernel goes through the vendor library
(libfakeblasLt.so.13: its own runtime copy, cuLaunchKernel taken with cuGetProcAddress_v2), none
through the runtime; copies and syncs stay on the runtime. launches_by_path: all "library".
Run it once more with FAKECUDA_PROCADDR=internal in the environment for the internal-pointer shape.
See tests/README.md; usage: python driver_paths_vendor.py [--ready FILE] [--truth FILE] [--steps N]"""
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
    launch_path="vendor",
    verdict="gpu_bound",
)

if __name__ == "__main__":
    groundtruth.run("driver_paths_vendor", CONFIG)
