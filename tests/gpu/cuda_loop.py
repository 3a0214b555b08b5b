"""GPU check workload: a small CUDA PyTorch training loop with a known shape.

Usage: python3 cuda_loop.py --mode input|compute [--steps N] [--ready FILE] [--truth FILE]
                            [--steps-log FILE] [--profile-steps N]
  input:   the Dataset sleeps 4 ms per item (batch 8, num_workers=0): INPUT-BOUND expected
  compute: an MLP of 8 x 4096-wide layers, batch 512, bf16 autocast: COMPUTE-BOUND expected
Prints {"pid": ...} once CUDA is initialised, waits for --ready, then trains. With
--profile-steps N it first runs N steps under torch.profiler (before --ready, so the daemon does
not see them) and writes the CUDA kernel count per step into the truth file, to compare with the
daemon's launches per step. Truth: per-step wall time and input wait from the loop's own clock
(CLOCK_MONOTONIC), written to --truth.
"""
import argparse
import json
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=["input", "compute"], default="compute")
ap.add_argument("--steps", type=int, default=200)
ap.add_argument("--ready")
ap.add_argument("--truth")
ap.add_argument("--steps-log")
ap.add_argument("--profile-steps", type=int, default=0)
a = ap.parse_args()

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

dev = torch.device("cuda")
torch.manual_seed(0)
now = time.monotonic_ns
if a.mode == "input":
    width, layers, batch, item_sleep = 1024, 4, 8, 0.004
else:
    width, layers, batch, item_sleep = 4096, 8, 512, 0.0


class Data(Dataset):
    def __init__(self):
        self.x = torch.randn(256, width)
        self.y = torch.randn(256, 1)
        self.wait_ns = 0

    def __len__(self):
        return 10 ** 9

    def __getitem__(self, i):
        t = now()
        if item_sleep:
            time.sleep(item_sleep)
        self.wait_ns += now() - t
        return self.x[i % 256], self.y[i % 256]


ds = Data()
loader = DataLoader(ds, batch_size=batch, num_workers=0, pin_memory=True)
mods = []
for _ in range(layers):
    mods += [nn.Linear(width, width), nn.ReLU()]
model = nn.Sequential(*mods, nn.Linear(width, 1)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
lossf = nn.MSELoss()
it = iter(loader)


def step():
    x, y = next(it)
    x = x.to(dev, non_blocking=True)
    y = y.to(dev, non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x)
        loss = lossf(out.float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(5):
    step()
torch.cuda.synchronize()
kernels_per_step = None
if a.profile_steps:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(a.profile_steps):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels_per_step = len(kernels) / a.profile_steps
    launches = [e for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel",
                                                        "cudaLaunchKernelExC", "cuLaunchKernelEx")]
    launch_apis = {}
    for e in launches:
        launch_apis[e.name] = launch_apis.get(e.name, 0) + 1
    launch_apis = {k: v / a.profile_steps for k, v in launch_apis.items()}
print(json.dumps({"pid": os.getpid(), "mode": a.mode, "torch": torch.__version__,
                  "device": torch.cuda.get_device_name(0)}), flush=True)
if a.ready:
    while not os.path.exists(a.ready):
        time.sleep(0.01)
log = open(a.steps_log, "a", buffering=1) if a.steps_log else None
walls, waits = [], []
ds.wait_ns = 0
t_prev = now()
for i in range(a.steps):
    w0 = ds.wait_ns
    step()
    t = now()
    walls.append(t - t_prev)
    waits.append(ds.wait_ns - w0)
    t_prev = t
    if log:
        log.write(f"{t}\n")
if a.truth:
    with open(a.truth, "w") as f:
        json.dump({"mode": a.mode, "steps": a.steps,
                   "step_median_ms": statistics.median(walls) / 1e6,
                   "input_wait_share": sum(waits) / sum(walls),
                   "profiler_kernels_per_step": kernels_per_step,
                   "profiler_launch_apis_per_step": launch_apis if a.profile_steps else None}, f)
print(json.dumps({"done": a.mode, "step_median_ms": statistics.median(walls) / 1e6}), flush=True)
