"""Bundled demo for `cargo xtask demo`: a small training loop that is input-bound by construction
(fake torch + the stand-in CUDA runtime; no GPU needed). ~25 steps, ~4 s.

Each step: the DataLoader's __getitem__ sleeps 30 ms per item (batch of 4 = ~120 ms of waiting for
data), then a quick forward/backward/optimizer step with simulated kernels (~25 ms).
Usage: python demo_train.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

MS = 1_000_000
CONFIG = dict(steps=25, batch_size=4, getitem_ns=30 * MS, layers=3, layer_cpu_ns=2 * MS,
              kernel_ns=1 * MS, bwd_cpu_ns=2 * MS, opt_cpu_ns=3 * MS, verdict="input_bound")

if __name__ == "__main__":
    groundtruth.BANNER = ("demo: training a 3-layer model for 25 steps; the data loader reads 4 samples per step "
          "at 30 ms each, the model needs ~25 ms per step, so the GPU mostly waits for input.")
    t = groundtruth.run("demo_train", CONFIG)
    med = t["median_phases_ns"]
    print("demo: done. Ground truth per step (median): "
          + ", ".join(f"{k} {v / 1e6:.1f} ms" for k, v in med.items()), flush=True)
