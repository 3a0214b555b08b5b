"""Bench workload for the daemon's memory over long runs: a fake-torch loop of ~1.5 ms steps
(1 DataLoader item, 2 layers, a loss.item() sync), run for --steps N (default 30,000, ~50 s).
Same protocol and truth format as the ground-truth scenarios (groundtruth.py)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import groundtruth  # noqa: E402

US = 1000
CFG = dict(steps=30_000, batch_size=1, getitem_ns=150 * US, layers=2, layer_cpu_ns=150 * US,
           bwd_cpu_ns=200 * US, opt_cpu_ns=200 * US, kernel_ns=10 * US, verdict="balanced")

if __name__ == "__main__":
    groundtruth.run("long_run", CFG)
