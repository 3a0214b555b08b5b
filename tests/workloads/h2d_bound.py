"""Ground-truth scenario h2d_bound: 16 MB of pageable input per step (non_blocking=True, no sync) at 0.5 GB/s: ~32 ms host-blocked in cudaMemcpyAsync(H2D).
See tests/README.md; usage: python h2d_bound.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=60,
    batch_size=2,
    getitem_ns=200000,
    item_bytes=8000000,
    bandwidth=500000000,
    non_blocking=True,
    pinned=False,
    sync_per_step=False,
    verdict='h2d_bound',
)

if __name__ == "__main__":
    groundtruth.run("h2d_bound", CONFIG)
