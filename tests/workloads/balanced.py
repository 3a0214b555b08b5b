"""Ground-truth scenario balanced: the overhead phases (input wait, H2D, residual) are each well
under the 10 % warning threshold and compute (forward, backward, optimizer, GPU wait) well under the
90 % compute-bound line: ~2 ms input, ~3 ms H2D, ~3 ms residual, ~35 ms compute per step.
See tests/README.md; usage: python balanced.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=100,
    batch_size=2,
    getitem_ns=300000,
    item_bytes=1000000,
    bandwidth=1000000000,
    layer_cpu_ns=5000000,
    bwd_cpu_ns=6000000,
    opt_cpu_ns=7000000,
    kernel_ns=500000,
    residual_sleep_ns=2000000,
    verdict='balanced',
)

if __name__ == "__main__":
    groundtruth.run("balanced", CONFIG)
