"""Ground-truth scenario input_bound_single: single-process DataLoader, __getitem__ sleeps 15 ms per item (30 ms per batch); ~6 ms of compute.
See tests/README.md; usage: python input_bound_single.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=80,
    batch_size=2,
    getitem_ns=15000000,
    verdict='input_bound',
)

if __name__ == "__main__":
    groundtruth.run("input_bound_single", CONFIG)
