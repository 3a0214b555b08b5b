"""Ground-truth scenario compute_bound: long simulated kernels (4 ms each, ~70 ms of device time per step) and loss.item() per step: the host waits in the D2H copy/sync.
See tests/README.md; usage: python compute_bound.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=50,
    batch_size=2,
    getitem_ns=200000,
    kernel_ns=4000000,
    layer_launches=2,
    bwd_launches=4,
    opt_launches=2,
    verdict='gpu_bound',
)

if __name__ == "__main__":
    groundtruth.run("compute_bound", CONFIG)
