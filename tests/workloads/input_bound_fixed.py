"""Ground-truth scenario input_bound_fixed: input_bound_single after its fix. The same model and
batches, but the samples are ready (__getitem__ takes 0.2 ms instead of 15 ms, as if decoded once
and cached). Recorded beside input_bound_single for the compare tests: B must be an IMPROVEMENT
over A, with input_wait named.
See tests/README.md; usage: python input_bound_fixed.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=80,
    batch_size=2,
    getitem_ns=200000,
    # Still a warning: data loading (collate, 2 items) is ~15 % of the now much shorter step.
    verdict='input_bound',
)

if __name__ == "__main__":
    groundtruth.run("input_bound_fixed", CONFIG)
