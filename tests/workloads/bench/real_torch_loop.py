"""Bench workload: the real-PyTorch CPU loop of real_torch_train.py, optionally instrumented with
TraceML (traceml-ai) the way its README documents for a plain PyTorch loop:

    import traceml_ai as traceml
    traceml.init(mode="auto")
    ...
    with traceml.trace_step(model): <the step>

Run it with TraceML as `traceml run real_torch_loop.py --args --traceml ...`. Without --traceml it
is the plain loop (what traceml-daemon attaches to). Same protocol as the ground-truth workloads:
first stdout line {"pid": ...}, waits for --ready FILE, writes the truth JSON to --truth FILE
(format traceml-truth/1, phases as in real_torch_train.py).
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from real_torch_train import PHASES, SCENARIOS  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="input_bound")
    ap.add_argument("--ready")
    ap.add_argument("--truth")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--traceml", action="store_true", help="the two TraceML lines (run under `traceml run`)")
    a = ap.parse_args()
    cfg = dict(SCENARIOS[a.scenario])
    if a.steps:
        cfg["steps"] = a.steps
    print(json.dumps({"pid": os.getpid(), "scenario": "real_" + a.scenario, "python": sys.version.split()[0],
                      "executable": sys.executable}), flush=True)

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
    if a.traceml:
        import traceml_ai as traceml
        traceml.init(mode="auto")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    H = cfg["hidden"]

    class SlowDataset(Dataset):
        def __init__(self, n):
            self.n = n
            self.x = torch.randn(n, 64)
            self.y = torch.randn(n, 1)

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            time.sleep(cfg["getitem_ns"] / 1e9)
            return self.x[i], self.y[i]

    loader = DataLoader(SlowDataset(cfg["steps"] * cfg["batch_size"]), batch_size=cfg["batch_size"])
    model = nn.Sequential(nn.Linear(64, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, 1))
    lossf = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xb = torch.randn(cfg["batch_size"], 64)
    lossf(model(xb), torch.randn(cfg["batch_size"], 1)).backward()
    opt.step()
    opt.zero_grad()

    while a.ready and not os.path.exists(a.ready):
        time.sleep(0.01)

    step_ctx = (lambda: traceml.trace_step(model)) if a.traceml else contextlib.nullcontext
    now = time.monotonic_ns
    raw = []
    it = iter(loader)
    loop_start = now()
    while True:
        t0 = now()
        try:
            batch = next(it)
        except StopIteration:
            t_stop_start = t0
            break
        t1 = now()
        with step_ctx():
            t1b = now()
            out = model(batch[0])
            t3 = now()
            loss = lossf(out, batch[1])
            t4 = now()
            opt.zero_grad()
            t5 = now()
            loss.backward()
            t6 = now()
            opt.step()
            t7 = now()
        if cfg["residual_sleep_ns"]:
            time.sleep(cfg["residual_sleep_ns"] / 1e9)
        del batch, out, loss
        raw.append((t0, t1, t1b, t4, t5, t6, t7))
    loop_end = now()

    steps = []
    for i, (t0, t1, t1b, t4, t5, t6, t7) in enumerate(raw):
        t_end = raw[i + 1][0] if i + 1 < len(raw) else t_stop_start
        ph = {"input_wait": t1 - t0, "h2d": 0, "forward": t4 - t1b, "backward": t6 - t5,
              "optimizer": t7 - t6, "gpu_wait": 0}
        ph["residual"] = (t_end - t0) - sum(ph.values())
        steps.append({"index": i, "wall_ns": t_end - t0, "phases_ns": ph})
    med = {p: int(statistics.median(s["phases_ns"][p] for s in steps)) for p in PHASES}
    truth = {"format": "traceml-truth/1", "scenario": "real_" + a.scenario, "backend": "torch-cpu",
             "traceml": a.traceml, "expected_verdict": cfg["verdict"], "dominant_phase": max(med, key=med.get),
             "step_count": len(steps), "steps": steps, "median_phases_ns": med,
             "loop_start_ns": loop_start, "loop_end_ns": loop_end}
    if a.truth:
        with open(a.truth + ".tmp", "w") as f:
            json.dump(truth, f)
        os.replace(a.truth + ".tmp", a.truth)
    print(json.dumps({"done": truth["scenario"], "steps": len(steps),
                      "median_ms": {p: round(v / 1e6, 2) for p, v in med.items()}}), flush=True)


if __name__ == "__main__":
    main()
