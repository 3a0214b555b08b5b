"""Ground-truth scenario gpu_wait_periodic: no sync per step; every 10th step `out.cpu()` copies the output to the host and waits for the device's backlog (1 ms kernels, ~15 per step, the host ~3 ms a step): ~90 % of the run in that wait, at one line.
See tests/README.md; usage: python gpu_wait_periodic.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=60,
    batch_size=2,
    getitem_ns=200000,
    kernel_ns=1000000,
    sync_per_step=False,
    cpu_every=10,
    verdict='gpu_bound',
)

if __name__ == "__main__":
    groundtruth.run("gpu_wait_periodic", CONFIG)
