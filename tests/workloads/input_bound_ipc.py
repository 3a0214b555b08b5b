"""Ground-truth scenario input_bound_ipc: 2 worker processes that make their items fast (1 ms
sleep each) but whose items carry a Record that costs the training process 6 ms of CPU to unpickle
(rebuild_record, as a Python object rebuilt on arrival): the workers are done before the loop asks
and the input wait (~24 ms a step, batch 4) is the hand-over. The daemon must find the hand-over's
share of the input wait (each step's handover_ns in the truth), name rebuild_record and say that
more workers will not help.
See tests/README.md; usage: python input_bound_ipc.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=60,
    batch_size=4,
    num_workers=2,
    getitem_ns=1000000,
    item_rebuild_ns=6000000,
    record_bytes=65536,
    verdict='input_bound',
)

if __name__ == "__main__":
    groundtruth.run("input_bound_ipc", CONFIG)
