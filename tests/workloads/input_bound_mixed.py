"""Ground-truth scenario input_bound_mixed: input_bound_workers (2 worker processes, __getitem__
sleeps 20 ms per item, batch 4) whose items also carry a Record costing the training process 3 ms
of CPU to unpickle (rebuild_record): ~12 ms of the ~34 ms input wait is the hand-over, the rest is
waiting for the sleeping workers. The daemon's hand-over share must match each step's handover_ns
over its input wait, and the workers (not the hand-over) stay what limits the pipeline.
See tests/README.md; usage: python input_bound_mixed.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=60,
    batch_size=4,
    num_workers=2,
    getitem_ns=20000000,
    item_rebuild_ns=3000000,
    record_bytes=65536,
    verdict='input_bound',
)

if __name__ == "__main__":
    groundtruth.run("input_bound_mixed", CONFIG)
