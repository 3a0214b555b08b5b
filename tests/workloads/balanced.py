"""Ground-truth scenario balanced: every phase a few ms, none dominates.
See tests/README.md; usage: python balanced.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=100,
    batch_size=2,
    getitem_ns=3000000,
    item_bytes=2000000,
    bandwidth=1000000000,
    layer_cpu_ns=1500000,
    bwd_cpu_ns=2000000,
    opt_cpu_ns=4000000,
    kernel_ns=500000,
    residual_sleep_ns=4000000,
    verdict='balanced',
)

if __name__ == "__main__":
    groundtruth.run("balanced", CONFIG)
