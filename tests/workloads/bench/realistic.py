"""Bench workload: a realistic training loop on the fake torch package and the stand-in CUDA
runtime, with a typical number of module calls, copies and kernel launches per step, in steps of
about 20, 100 or 500 ms. Host-bound by construction (kernels are short), so time added on the
host shows fully in the step time (the worst case for overhead).

Usage: python realistic.py --step-ms {20,100,500} [--ready FILE] [--truth FILE] [--steps N]
Same protocol and truth format as the ground-truth scenarios (groundtruth.py).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import groundtruth  # noqa: E402

US = 1000
MS = 1_000_000
# Per step: 1 DataLoader next, 2 H2D copies, Sequential + `layers` Linear + (layers-1) ReLU + loss
# module calls, launches = layers*(4 fwd + 8 bwd) + (layers-1) ReLU + 1 loss + opt_launches,
# one loss.item() (D2H copy + sync).
CONFIGS = {
    # ~20 ms: 16 layers, ~240 launches/step
    20: dict(steps=60, batch_size=2, getitem_ns=1 * MS, item_bytes=1 << 20, layers=16, layer_cpu_ns=250 * US,
             layer_launches=4, bwd_cpu_ns=400 * US, bwd_launches=8, opt_cpu_ns=3 * MS, opt_launches=32,
             kernel_ns=5 * US),
    # ~100 ms: 48 layers, ~680 launches/step
    100: dict(steps=24, batch_size=2, getitem_ns=5 * MS, item_bytes=4 << 20, layers=48, layer_cpu_ns=600 * US,
              layer_launches=4, bwd_cpu_ns=800 * US, bwd_launches=8, opt_cpu_ns=20 * MS, opt_launches=48,
              kernel_ns=20 * US),
    # ~500 ms: 96 layers, ~1300 launches/step
    500: dict(steps=8, batch_size=4, getitem_ns=20 * MS, item_bytes=8 << 20, layers=96, layer_cpu_ns=1600 * US,
              layer_launches=4, bwd_cpu_ns=2 * MS, bwd_launches=8, opt_cpu_ns=60 * MS, opt_launches=64,
              kernel_ns=20 * US),
}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-ms", type=int, choices=sorted(CONFIGS), required=True)
    ap.add_argument("--ready")
    ap.add_argument("--truth")
    ap.add_argument("--steps", type=int)
    a = ap.parse_args()
    cfg = dict(CONFIGS[a.step_ms])
    cfg["verdict"] = "any"
    if a.steps is None:
        a.steps = cfg["steps"]
    groundtruth.run(f"realistic_{a.step_ms}ms", cfg, a)
