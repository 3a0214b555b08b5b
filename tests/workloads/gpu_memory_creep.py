"""Ground-truth scenario gpu_memory_creep: compute_bound's loop (4 ms kernels) keeping 4 MiB of device memory alive every step (a tensor appended to a list): the process's GPU memory grows by 4 MiB a step (truth: device_reserved_bytes per step).
See tests/README.md; usage: python gpu_memory_creep.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compute_bound  # noqa: E402
import groundtruth  # noqa: E402

CONFIG = dict(compute_bound.CONFIG, steps=60, grow_bytes=4 << 20)

if __name__ == "__main__":
    groundtruth.run("gpu_memory_creep", CONFIG)
