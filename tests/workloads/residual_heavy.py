"""Ground-truth scenario residual_heavy: 40 ms of sleep plus a log line after every step, outside every phase.
See tests/README.md; usage: python residual_heavy.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=60,
    batch_size=2,
    getitem_ns=500000,
    residual_sleep_ns=40000000,
    log_every=1,
    verdict='residual_heavy',
)

if __name__ == "__main__":
    groundtruth.run("residual_heavy", CONFIG)
