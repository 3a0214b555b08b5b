"""Ground-truth scenario whatif_input: the what-if pair's input-bound run. A single-process
DataLoader whose __getitem__ sleeps 15 ms per item (30 ms a batch) in front of ~19 ms of compute
(three times input_bound_single's, so that the machine's run-to-run swing is a small part of the
step). Its fix is whatif_input_fixed: the what-if for input_wait here must land within 10 % of the
step that run measures.
See tests/README.md; usage: python whatif_input.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=60,
    batch_size=2,
    getitem_ns=15000000,
    layer_cpu_ns=3000000,
    bwd_cpu_ns=4000000,
    opt_cpu_ns=5000000,
    verdict='input_bound',
)

if __name__ == "__main__":
    groundtruth.run("whatif_input", CONFIG)
