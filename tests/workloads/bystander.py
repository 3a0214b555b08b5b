"""A torch process that does not train (issue 23): the bystander a node service must leave alone.

Real torch (CPU). Modes:
  infer   an inference-like loop: model.eval(), torch.no_grad() forwards of a small MLP with
          Python pre- and post-processing (list comprehensions, a generator), no DataLoader, no
          optimizer, no backward
  python  pure Python work (dicts, comprehensions, a generator) in a process that imports torch

Usage: python bystander.py --mode infer|python [--seconds S] [--truth FILE] [--ready FILE]
                           [--train-after S --train-steps N] [--window S]
First stdout line {"pid": ...}. Runs work units for --seconds (wall), timing each one
(CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns). With --train-after it then trains like a
notebook calling fit: --train-steps steps of a DataLoader batch → forward → backward →
SGD step (the markers a daemon watching for training finds). At the end it writes the truth
(--truth, JSON, write + rename):
  units: [[t_start_ns, t_end_ns], ...]   every work unit
  windows: [{t_start_ns, t_end_ns, units, mean_unit_ns}]   consecutive --window second windows
  markers: {dataloader_iterations, optimizer_steps, backward_passes}   what it did (0 before
           training)
  train: {t_start_ns, t_start_unix_s, t_end_ns, steps} or null
SIGTERM ends the loop after the current unit (the truth is written).
"""
import argparse
import json
import os
import signal
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=["infer", "python"], required=True)
ap.add_argument("--seconds", type=float, default=10.0)
ap.add_argument("--truth")
ap.add_argument("--ready", help="wait until this file exists before the loop")
ap.add_argument("--train-after", type=float)
ap.add_argument("--train-steps", type=int, default=40)
ap.add_argument("--window", type=float, default=1.0)
a = ap.parse_args()

import torch  # noqa: E402

torch.set_num_threads(1)
now = time.monotonic_ns
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
model.eval()


def tokens(n):
    for i in range(n):
        yield (i * 7919) % 101 / 101.0


def infer_unit():
    # pre-processing in Python, one small batched forward, post-processing in Python
    rows = [[v for v in tokens(32)] for _ in range(8)]
    with torch.no_grad():
        out = model(torch.tensor(rows))
    best = [max(range(8), key=lambda j: r[j]) for r in out.tolist()]
    return sum(best)


def python_unit():
    d = {i: str(i) for i in range(400)}
    s = sum(len(v) for v in d.values())
    return s + sum(x for x in tokens(400) if x > 0.5)


unit = infer_unit if a.mode == "infer" else python_unit
print(json.dumps({"pid": os.getpid(), "mode": a.mode, "torch": torch.__version__}), flush=True)
while a.ready and not os.path.exists(a.ready):
    time.sleep(0.01)

units = []
t_begin = now()
end = t_begin + int(a.seconds * 1e9)
while not stop and now() < end:
    t0 = now()
    unit()
    units.append((t0, now()))

markers = {"dataloader_iterations": 0, "optimizer_steps": 0, "backward_passes": 0}
train = None
if a.train_after is not None and not stop:
    time.sleep(max(0.0, a.train_after - (now() - t_begin) / 1e9))
    ds = torch.utils.data.TensorDataset(torch.randn(a.train_steps * 4, 32), torch.randn(a.train_steps * 4, 8))
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    lossf = torch.nn.MSELoss()
    t_train = now()
    t_train_unix = time.time()
    steps = 0
    it = iter(loader)
    while True:
        markers["dataloader_iterations"] += 1
        try:
            x, y = next(it)
        except StopIteration:
            break
        loss = lossf(model(x), y)
        opt.zero_grad()
        loss.backward()
        markers["backward_passes"] += 1
        opt.step()
        markers["optimizer_steps"] += 1
        steps += 1
        time.sleep(0.02)  # a step of ~20 ms
    train = {"t_start_ns": t_train, "t_start_unix_s": t_train_unix, "t_end_ns": now(), "steps": steps}

windows = []
w = int(a.window * 1e9)
if units:
    start = units[0][0]
    while start < units[-1][1]:
        inside = [u for u in units if start <= u[0] < start + w]
        if inside:
            windows.append({"t_start_ns": start, "t_end_ns": start + w, "units": len(inside),
                            "mean_unit_ns": sum(e - s for s, e in inside) / len(inside)})
        start += w
truth = {"format": "traceml-truth-bystander/1", "mode": a.mode, "pid": os.getpid(),
         "python": sys.version.split()[0], "torch": torch.__version__,
         "units": units, "windows": windows, "markers": markers, "train": train}
if a.truth:
    tmp = a.truth + ".tmp"
    with open(tmp, "w") as f:
        json.dump(truth, f)
    os.replace(tmp, a.truth)
print(json.dumps({"done": len(units), "train": train}), flush=True)
