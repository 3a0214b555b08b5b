"""Bench workload for the long-lived daemon (`cargo xtask bench --service-only`): a fake-torch
loop of ~100 ms steps that spends most of each step asleep in the DataLoader (2 items × 45 ms)
and ~5 ms on the CPU, so that eight of them, or one for an hour, leave the machine's cores to the
daemon being measured. Same protocol and truth format as the ground-truth scenarios
(groundtruth.py); --steps N (default 900, ~90 s; 36,000 is about an hour)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import groundtruth  # noqa: E402

US = 1000
CFG = dict(steps=900, batch_size=2, getitem_ns=45_000 * US, layers=2, layer_cpu_ns=1000 * US,
           bwd_cpu_ns=800 * US, opt_cpu_ns=800 * US, kernel_ns=100 * US, verdict="input_bound")

if __name__ == "__main__":
    groundtruth.run("service_job", CFG)
