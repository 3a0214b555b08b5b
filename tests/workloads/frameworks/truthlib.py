"""Shared pieces of the real-framework workloads (hf_trainer.py, lightning_train.py): the command
line, the start line / ready handshake, the steps log, span clocks and the truth file.

Truth is measured with time.monotonic_ns() (CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns). The
workloads record *spans* (phase, t0, t1) from their own hooks and the *end* of every step; a step
is the interval between two step ends (the first one starts where the first batch fetch starts),
and a phase's time in a step is the overlap of its spans with that interval. Phases that the
framework nests (Lightning runs forward and backward inside optimizer.step(closure)) are recorded
with a "minus" phase whose time is subtracted (optimizer = step span - closure span).
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time

PHASES = ("input_wait", "h2d", "forward", "backward", "optimizer", "gpu_wait", "residual")
MS = 1_000_000
now = time.monotonic_ns


def offline_env():
    """No network: nothing may be fetched from a hub, no telemetry, no experiment trackers."""
    for k, v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"),
                 ("HF_HUB_DISABLE_TELEMETRY", "1"), ("TOKENIZERS_PARALLELISM", "false"),
                 ("WANDB_DISABLED", "true"), ("WANDB_MODE", "disabled"), ("DISABLE_MLFLOW_INTEGRATION", "TRUE"),
                 ("PL_DISABLE_FORK", "1"), ("CUDA_VISIBLE_DEVICES", "")):
        os.environ.setdefault(k, v)


def parse(description, modes, default_steps):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--mode", choices=modes, default=modes[0])
    ap.add_argument("--steps", type=int, help="optimizer steps (default: %s)" % default_steps)
    ap.add_argument("--ready", help="wait until this file exists before training (polls every 10 ms)")
    ap.add_argument("--truth", help="write the truth JSON here at exit (write + rename)")
    ap.add_argument("--steps-log", help="append one line per finished step: its end, CLOCK_MONOTONIC ns")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    a = ap.parse_args()
    if a.steps is None:
        a.steps = default_steps[a.mode]
    return a


def start_line(scenario, **extra):
    """The first stdout line: printed once torch and the framework are imported and the model is
    built, so a harness attaches to a started job."""
    print(json.dumps({"pid": os.getpid(), "scenario": scenario, "python": sys.version.split()[0],
                      "executable": sys.executable, **extra}), flush=True)


def wait_ready(path):
    while path and not os.path.exists(path):
        time.sleep(0.01)


class Clock:
    """Spans by phase and step ends, appended from the training thread's hooks."""

    def __init__(self, steps_log=None):
        self.spans = {}  # phase -> [(t0, t1)]
        self.step_ends = []
        self.first_start = None
        self._log = open(steps_log, "a", buffering=1) if steps_log else None
        self.tid = threading.get_native_id()

    def span(self, phase, t0, t1):
        self.spans.setdefault(phase, []).append((t0, t1))
        if self.first_start is None:
            self.first_start = t0

    def step_end(self, t=None):
        t = t or now()
        self.step_ends.append(t)
        if self._log:
            self._log.write("%d\n" % t)
            self._log.flush()
        return t

    @contextlib.contextmanager
    def phase(self, phase):
        """`with clock.phase("forward"): ...`: the block is one span of `phase` (also when it
        raises)."""
        t0 = now()
        try:
            yield
        finally:
            self.span(phase, t0, now())

    def timed(self, phase, fn):
        """fn wrapped so that each call is a span of `phase`."""
        def wrapper(*args, **kwargs):
            t0 = now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.span(phase, t0, now())
        wrapper.__wrapped__ = fn
        return wrapper


def clock_dataloader_next(clock, phase="input_wait"):
    """Clocks every DataLoader iterator's `__next__` (the whole call, as the daemon's input_wait
    is: torch's record_function and the `__next__` frame span it) by wrapping
    `torch.utils.data.dataloader._BaseDataLoaderIter.__next__`, which every single- and
    multi-process iterator inherits. A batch fetched is one span; a call that raises
    (StopIteration: an epoch's end) is none. The Dataset's own clock (first `__getitem__` to the
    collate function's return) left out the DataLoader's bookkeeping around it, and any time the
    thread was descheduled there: on a machine kept busy, 50 ms of one fetch."""
    from torch.utils.data import dataloader
    inner = dataloader._BaseDataLoaderIter.__next__

    def __next__(self):
        t0 = now()
        batch = inner(self)
        clock.span(phase, t0, now())
        return batch

    dataloader._BaseDataLoaderIter.__next__ = __next__


def _overlap(spans, a, b):
    return sum(max(0, min(t1, b) - max(t0, a)) for t0, t1 in spans)


def _pieces(a, b, excluded):
    """[a, b) less the excluded spans (sorted, disjoint in practice)."""
    out, cur = [], a
    for t0, t1 in sorted(excluded):
        if t1 <= cur or t0 >= b:
            continue
        if t0 > cur:
            out.append((cur, t0))
        cur = max(cur, t1)
    if cur < b:
        out.append((cur, b))
    return out


def build_truth(clock, *, scenario, backend, config, expected_verdict, phase_spans, extra_spans=(),
                minus=None, counts=None, versions=None, exclude=(), gaps=()):
    """phase_spans: truth phase -> the span names that add up to it; minus: truth phase -> span
    names subtracted from it (nested work already counted elsewhere); extra_spans: span names
    reported per step as `<name>_ns` outside the phases (part of the residual); exclude: span
    names that are no part of the steps (evaluation): a step's wall and phases leave them out,
    and `evaluation` reports them; gaps: span names that are no part of the steps either (the
    pause between two epochs) but no evaluation: left out of the steps, reported nowhere."""
    minus = minus or {}
    excluded = [s for n in exclude for s in clock.spans.get(n, [])]
    cut = excluded + [s for n in gaps for s in clock.spans.get(n, [])]
    starts = [clock.first_start] + clock.step_ends[:-1]
    steps = []
    for i, (a, b) in enumerate(zip(starts, clock.step_ends)):
        pieces = _pieces(a, b, cut)
        ov = lambda n: sum(_overlap(clock.spans.get(n, []), x, y) for x, y in pieces)  # noqa: E731
        wall = sum(y - x for x, y in pieces)
        ph = {p: 0 for p in PHASES if p != "residual"}
        for p, names in phase_spans.items():
            ph[p] = sum(ov(n) for n in names)
            ph[p] -= sum(ov(n) for n in minus.get(p, ()))
        ph["residual"] = wall - sum(ph.values())
        step = {"index": i, "t_start_ns": a, "t_end_ns": b, "wall_ns": wall, "phases_ns": ph}
        for n in extra_spans:
            step[n + "_ns"] = ov(n)
        steps.append(step)
    # Step 0 carries one-time work (first fetches of the prefetching loaders, lazy init): the
    # medians below are over every step, as in the other truth files; `steady` drops step 0.
    med = {p: int(statistics.median(s["phases_ns"][p] for s in steps)) for p in PHASES} if steps else {}
    walls = [s["wall_ns"] for s in steps]
    dominant = max(med, key=med.get) if med else None
    compute = sum(med.get(p, 0) for p in ("forward", "backward", "optimizer"))
    step_med = int(statistics.median(walls)) if walls else 0
    truth = {
        "format": "traceml-truth/1",
        "scenario": scenario,
        "backend": backend,
        "versions": versions or {},
        "python": sys.version.split()[0],
        "pid": os.getpid(),
        "tid": clock.tid,
        "clock": "CLOCK_MONOTONIC",
        "config": config,
        "expected_verdict": expected_verdict,
        "dominant_phase": dominant,
        "loop_start_ns": clock.first_start,
        "loop_end_ns": clock.step_ends[-1] if clock.step_ends else None,
        "step_count": len(steps),
        "steps": steps,
        "median_phases_ns": med,
        "median_step_ns": step_med,
        "compute_share_of_median_step": round(compute / step_med, 4) if step_med else None,
        "totals": {"wall_ns": sum(walls), **{f"{p}_ns": sum(s["phases_ns"][p] for s in steps) for p in PHASES}},
        "counts": counts or {},
        "evaluation": {"segments": len(excluded), "wall_ns": sum(t1 - t0 for t0, t1 in excluded),
                       "input_wait_ns": sum(_overlap(clock.spans.get("input_wait", []), t0, t1)
                                            for t0, t1 in excluded)},
    }
    return truth


def write_truth(path, truth):
    if not path:
        return
    with open(path + ".tmp", "w") as f:
        json.dump(truth, f, indent=1)
    os.replace(path + ".tmp", path)


def done_line(truth):
    med = truth["median_phases_ns"]
    tot = truth["totals"]
    print(json.dumps({"done": truth["scenario"], "steps": truth["step_count"],
                      "step_median_ms": round(truth["median_step_ns"] / 1e6, 2),
                      "median_ms": {p: round(v / 1e6, 2) for p, v in med.items()},
                      "share": {p: round(tot[f"{p}_ns"] / max(tot["wall_ns"], 1), 3) for p in PHASES},
                      "dominant": truth["dominant_phase"]}), flush=True)
