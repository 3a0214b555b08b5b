"""Ground-truth scenario input_bound_cpu_workers: 2 worker processes whose __getitem__ burns 12 ms of
CPU per item in decode_sample() (48 ms of one core per batch of 4), no sleep; ~6 ms of compute per
step. The workers are CPU-bound: the daemon must name decode_sample, find them on a CPU, and say how
many workers keep pace. Each item's wall and CPU time go to <truth>.items.
See tests/README.md; usage: python input_bound_cpu_workers.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=60,
    batch_size=4,
    num_workers=2,
    getitem_ns=0,
    getitem_cpu_ns=12000000,
    verdict='input_bound',
)

if __name__ == "__main__":
    groundtruth.run("input_bound_cpu_workers", CONFIG)
