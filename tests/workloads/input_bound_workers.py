"""Ground-truth scenario input_bound_workers: 2 worker processes, __getitem__ sleeps 20 ms per item (80 ms per batch per worker): the main process waits ~35 ms per step.
See tests/README.md; usage: python input_bound_workers.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=60,
    batch_size=4,
    num_workers=2,
    getitem_ns=20000000,
    verdict='input_bound',
)

if __name__ == "__main__":
    groundtruth.run("input_bound_workers", CONFIG)
