"""Overflows the kernel's per-thread stack of open calls (traceml-daemon/tests/reliability.rs).

Prints {"pid": ...}, waits for --ready, then --rounds times advances a chain of --depth nested
DataLoader iterators once: the stand-in `_BaseDataLoaderIter.__next__` (a code object the daemon
tracks) reads `self.n`, which here is a property that first advances the next iterator of the
chain with `next()`, so each of the --depth `__next__` frames is entered from C and is open at
once. Past the kernel's 64 tracked calls per thread every entry is a `state_full` loss. Prints its
truth as one JSON line {"truth": {...}} and exits 0.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "countpkg"))
from torch.utils.data.dataloader import _BaseDataLoaderIter  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--ready", required=True)
ap.add_argument("--depth", type=int, default=100)
ap.add_argument("--rounds", type=int, default=50)
a = ap.parse_args()


class Chained(_BaseDataLoaderIter):
    def __init__(self, inner):
        self.i = 0
        self.inner = inner

    @property
    def n(self):
        if self.inner is not None:
            next(self.inner)
        return 1


def chain(depth):
    it = None
    for _ in range(depth):
        it = Chained(it)
    return it


print(json.dumps({"pid": os.getpid()}), flush=True)
while not os.path.exists(a.ready):
    time.sleep(0.01)
for _ in range(a.rounds):
    if next(chain(a.depth)) != 1:
        sys.exit("the chain did not advance")
print(json.dumps({"truth": {"rounds": a.rounds, "depth": a.depth, "next_calls": a.rounds * a.depth}}), flush=True)
