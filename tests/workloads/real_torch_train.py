"""Ground-truth workload with REAL PyTorch on CPU (real DataLoader, nn.Module, autograd, SGD).

Usage: python real_torch_train.py --scenario {input_bound,residual_heavy,balanced}
                                  [--ready FILE] [--truth FILE] [--steps N] [--workers N]
                                  [--steps-log FILE]
--steps-log FILE appends one line per finished step: its end, CLOCK_MONOTONIC ns (flushed).
Same protocol and truth format as the fake-torch scenarios (tests/README.md), with
"backend": "torch-cpu". No CUDA work happens, so h2d/gpu_wait are 0 and the byte/launch counters
are absent. Run it with a venv that has torch (e.g. /tmp/invest/venv311/bin/python).

`balanced` must sit inside a narrow band (input wait and residual each under 10 % of the step,
compute under 90 %) on any machine and under CPU load. Its input and residual work are therefore
CPU work on the training thread, sized from the model step's own CPU time measured at start-up:
when another process takes CPU, every phase slows by the same factor and the shares stay put.
(A sleep would not slow down while the model's CPU work does, and the run would drift to
COMPUTE_BOUND.) The other scenarios sit far from every line and keep their sleeps.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

PHASES = ("input_wait", "h2d", "forward", "backward", "optimizer", "gpu_wait", "residual")
MS = 1_000_000
SCENARIOS = {
    # getitem_ns per item, batch size, hidden width, residual sleep, expected verdict
    "input_bound": dict(steps=60, batch_size=4, getitem_ns=8 * MS, hidden=256, residual_sleep_ns=0,
                        verdict="input_bound"),
    "residual_heavy": dict(steps=60, batch_size=4, getitem_ns=200_000, hidden=256, residual_sleep_ns=40 * MS,
                           verdict="residual_heavy"),
    # balanced: input wait ~6-8 % (the DataLoader's own work topped up with CPU work in
    # __getitem__ to 5 %, + the loop's Python and load jitter) and residual ~5.5 % (zero_grad
    # topped up to 5 %) of the step, compute ~87 %: 2 to 4 points from each line, the middle of a
    # narrow band. CPU work sized at start-up (see above).
    # Hidden 2048: a weight's gradient (16 MB) stays under glibc's mmap threshold, so zero_grad
    # does not unmap it every step (at 3072 that page-fault churn was a quarter of the step).
    "balanced": dict(steps=80, batch_size=16, getitem_ns=0, hidden=2048, residual_sleep_ns=0,
                     input_cpu_share=0.05, residual_cpu_share=0.05, verdict="balanced"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="input_bound")
    ap.add_argument("--ready")
    ap.add_argument("--truth")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--steps-log")
    a = ap.parse_args()
    steps_log = open(a.steps_log, "a", buffering=1) if a.steps_log else None
    cfg = dict(SCENARIOS[a.scenario])
    if a.steps:
        cfg["steps"] = a.steps
    cfg["num_workers"] = a.workers
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
    torch.manual_seed(0)
    torch.set_num_threads(1)
    H = cfg["hidden"]

    def cpu_spin(ns):
        """Busy for `ns` of this thread's CPU time (longer in wall time when the CPU is shared)."""
        end = time.thread_time_ns() + ns
        while time.thread_time_ns() < end:
            pass

    class SlowDataset(Dataset):
        def __init__(self, n):
            self.n = n
            self.x = torch.randn(n, 64)
            self.y = torch.randn(n, 1)

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if cfg.get("getitem_cpu_ns"):
                cpu_spin(cfg["getitem_cpu_ns"])
            if cfg["getitem_ns"]:
                time.sleep(cfg["getitem_ns"] / 1e9)
            return self.x[i], self.y[i]

    loader = DataLoader(SlowDataset(cfg["steps"] * cfg["batch_size"]), batch_size=cfg["batch_size"],
                        num_workers=cfg["num_workers"])
    model = nn.Sequential(nn.Linear(64, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, 1))
    lossf = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # warm up once (first-call allocations / lazy init), outside the measured loop
    xb = torch.randn(cfg["batch_size"], 64)
    yb = torch.randn(cfg["batch_size"], 1)
    lossf(model(xb), yb).backward()
    opt.step()
    opt.zero_grad()
    if cfg.get("input_cpu_share"):
        # The model step's CPU time (forward, loss, backward, SGD), zero_grad's and the
        # DataLoader's own per batch, medians of 9; the input and residual CPU work top the last
        # two up to their shares of the whole step.
        probe = iter(DataLoader(SlowDataset(9 * cfg["batch_size"]), batch_size=cfg["batch_size"]))
        loader_cpu = []
        for _ in range(9):
            c0 = time.thread_time_ns()
            next(probe)
            loader_cpu.append(time.thread_time_ns() - c0)
        model_cpu, zero_cpu = [], []
        for _ in range(9):
            c0 = time.thread_time_ns()
            lossf(model(xb), yb).backward()
            opt.step()
            c1 = time.thread_time_ns()
            opt.zero_grad()
            model_cpu.append(c1 - c0)
            zero_cpu.append(time.thread_time_ns() - c1)
        step_cpu = statistics.median(model_cpu)
        compute_share = 1.0 - cfg["input_cpu_share"] - cfg["residual_cpu_share"]
        residual_cpu = step_cpu * cfg["residual_cpu_share"] / compute_share
        cfg["model_step_cpu_ns"] = int(step_cpu)
        cfg["zero_grad_cpu_ns"] = int(statistics.median(zero_cpu))
        cfg["loader_cpu_ns"] = int(statistics.median(loader_cpu))
        input_cpu = step_cpu * cfg["input_cpu_share"] / compute_share - cfg["loader_cpu_ns"]
        cfg["getitem_cpu_ns"] = max(0, int(input_cpu / cfg["batch_size"]))
        cfg["residual_cpu_ns"] = max(0, int(residual_cpu - cfg["zero_grad_cpu_ns"]))

    # The start line goes out once torch is imported and the model is built: the harness attaches
    # then, to a process that has started, as a user attaches to a running job.
    print(json.dumps({"pid": os.getpid(), "scenario": "real_" + a.scenario, "python": sys.version.split()[0],
                      "executable": sys.executable}), flush=True)
    while a.ready and not os.path.exists(a.ready):
        time.sleep(0.01)

    now = time.monotonic_ns
    raw = []
    it = iter(loader)
    loop_start = now()
    while True:
        t0 = now()
        try:
            batch = next(it)
        except StopIteration:
            t_stop = now()
            t_stop_start = t0  # the last step ends where the final (StopIteration) next() begins
            break
        t1 = now()
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
        if cfg.get("residual_cpu_ns"):
            cpu_spin(cfg["residual_cpu_ns"])
        t9 = now()
        del batch, out, loss
        t10 = now()
        raw.append((t0, t1, t3, t4, t5, t6, t7, t9, t10))
        if steps_log:
            steps_log.write("%d\n" % t10)
            steps_log.flush()
    loop_end = now()

    steps = []
    for i, (t0, t1, t3, t4, t5, t6, t7, t9, t10) in enumerate(raw):
        t_end = raw[i + 1][0] if i + 1 < len(raw) else t_stop_start
        ph = {"input_wait": t1 - t0, "h2d": 0, "forward": t4 - t1, "backward": t6 - t5,
              "optimizer": t7 - t6, "gpu_wait": 0}
        ph["residual"] = (t_end - t0) - sum(ph.values())
        steps.append({"index": i, "t_start_ns": t0, "t_end_ns": t_end, "wall_ns": t_end - t0, "phases_ns": ph,
                      "model_ns": t3 - t1, "loss_fn_ns": t4 - t3, "zero_grad_ns": t5 - t4,
                      "residual_sleep_ns": t9 - t7, "cleanup_ns": t10 - t9,
                      "unaccounted_ns": ph["residual"] - (t5 - t4) - (t9 - t7) - (t10 - t9)})
    med = {p: int(statistics.median(s["phases_ns"][p] for s in steps)) for p in PHASES}
    truth = {
        "format": "traceml-truth/1", "scenario": "real_" + a.scenario, "backend": "torch-cpu",
        "torch_version": torch.__version__, "python": sys.version.split()[0], "pid": os.getpid(),
        "tid": threading.get_native_id(), "clock": "CLOCK_MONOTONIC", "config": cfg,
        "expected_verdict": cfg["verdict"], "dominant_phase": max(med, key=med.get),
        "loop_start_ns": loop_start, "loop_end_ns": loop_end,
        "final_next": {"t_start_ns": t_stop_start, "t_end_ns": t_stop},
        "step_count": len(steps), "steps": steps, "median_phases_ns": med,
        "totals": {"wall_ns": sum(s["wall_ns"] for s in steps),
                   **{f"{p}_ns": sum(s["phases_ns"][p] for s in steps) for p in PHASES}},
        "record_function": {"enumerate(DataLoader)#%s.__next__" % type(it).__name__: len(steps) + 1,
                            "Optimizer.step#SGD.step": len(steps),
                            "Optimizer.zero_grad#SGD.zero_grad": len(steps)},
        "backward_calls": len(steps),
        "worker_pids": [w.pid for w in getattr(it, "_workers", [])],
    }
    if a.truth:
        with open(a.truth + ".tmp", "w") as f:
            json.dump(truth, f, indent=1)
        os.replace(a.truth + ".tmp", a.truth)
    print(json.dumps({"done": truth["scenario"], "steps": len(steps), "wall_s": round((loop_end - loop_start) / 1e9, 3),
                      "median_ms": {p: round(v / 1e6, 2) for p, v in med.items()},
                      "dominant": truth["dominant_phase"]}), flush=True)


if __name__ == "__main__":
    main()
