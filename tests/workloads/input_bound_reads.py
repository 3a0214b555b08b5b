"""Ground-truth scenario input_bound_reads: 2 worker processes whose __getitem__ reads one 4 KiB
chunk from a named pipe that a thread of the training process feeds every 10 ms (a slow source:
a network stream, a decoder process): the workers are blocked in read(2) on that pipe, ~40 ms a
batch of 4. The daemon must name the pipe's path (the truth's config.fifo_path) as what the
blocked workers read, and the Next line must say so. Each item's time in read goes to
<truth>.items (fifth column).
See tests/README.md; usage: python input_bound_reads.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=60,
    batch_size=4,
    num_workers=2,
    getitem_ns=0,
    fifo_every_ns=10000000,
    verdict='input_bound',
)

if __name__ == "__main__":
    groundtruth.run("input_bound_reads", CONFIG)
