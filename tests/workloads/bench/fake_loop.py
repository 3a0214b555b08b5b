"""Bench workload for the in-process overhead windows: the training loop of a ground-truth scenario
(groundtruth.py's model, dataset and step, on the fake torch package and the stand-in CUDA runtime)
run for a long time, logging the end of every step.

Usage: python fake_loop.py [--scenario balanced] [--steps N] [--ready FILE] [--steps-log FILE]
  prints {"pid": ...} as its first stdout line, waits for --ready FILE, then runs N steps (each:
  next(it), two .to('cuda'), model(x), loss, zero_grad, backward, step, loss.item(), the scenario's
  residual sleep) and appends each step's end (CLOCK_MONOTONIC ns) to --steps-log, flushed.
Runs on any pyenv CPython 3.9-3.13 (tests/build.sh first); no truth file (the bench reads only
step ends).
"""
import argparse
import importlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import groundtruth  # noqa: E402  (puts tests/faketorch on sys.path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="balanced", help="a tests/workloads/<scenario>.py with CONFIG")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--ready")
    ap.add_argument("--steps-log")
    a = ap.parse_args()
    cfg = dict(groundtruth.DEFAULTS)
    cfg.update(importlib.import_module(a.scenario).CONFIG)
    cfg["steps"] = a.steps
    import torch
    torch.cuda.set_bandwidth(cfg["bandwidth"])
    model = groundtruth.make_model(cfg).cuda()
    lossf = torch.nn.MSELoss(kernel_ns=cfg["kernel_ns"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, cpu_ns=cfg["opt_cpu_ns"],
                          launches=cfg["opt_launches"], kernel_ns=cfg["kernel_ns"])
    loader = torch.utils.data.DataLoader(groundtruth.make_dataset(cfg), batch_size=cfg["batch_size"],
                                         num_workers=cfg["num_workers"], pin_memory=cfg["pinned"])
    print(json.dumps({"pid": os.getpid(), "scenario": "fake_loop_" + a.scenario,
                      "python": sys.version.split()[0], "executable": sys.executable}), flush=True)
    groundtruth.wait_ready(a.ready)
    log = open(a.steps_log, "a", buffering=1) if a.steps_log else None
    nb = cfg["non_blocking"]
    n = 0
    for batch in loader:
        xd = batch[0].to("cuda", non_blocking=nb)
        yd = batch[1].to("cuda", non_blocking=nb)
        loss = lossf(model(xd), yd)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if cfg["sync_per_step"]:
            loss.item()
        if cfg["residual_sleep_ns"]:
            time.sleep(cfg["residual_sleep_ns"] / 1e9)
        del batch, xd, yd, loss
        n += 1
        if log:
            log.write("%d\n" % time.monotonic_ns())
            log.flush()
    print(json.dumps({"done": "fake_loop_" + a.scenario, "steps": n}), flush=True)


if __name__ == "__main__":
    main()
