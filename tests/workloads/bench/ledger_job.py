"""What the collective ledger costs a multi-rank job's step: an N-rank gloo DDP job
(tests/workloads/ddp/ddp_train.py under torchrun, real torch on CPU) runs for the whole
measurement; `traceml-daemon --pid <torchrun launcher> --duration W` is attached in the *on*
windows (the window: from every rank attached to the daemon's end) and absent in the *off* ones
(W s each, starting 1 s after the daemon exited), in the order off on off on ... off. Each on
window is compared with the mean of the off windows on both sides (drift cancels). Step times are
rank 0's, from its progress log (CLOCK_MONOTONIC at each step's end); a step counts in a window
when it starts and ends inside it. Usage, as root:
    python3 ledger_job.py WORKSPACE DAEMON N WINDOW_S ON_WINDOWS
Prints one JSON line (`cargo xtask bench --ranks-only` reads it): per window its kind, steps and
median step ms, per on window the ratio to its off neighbours, and what the daemon's summary
joined (collectives compared across ranks: the ledger was at work)."""
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

ws, daemon, n, window_s, on_windows = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
py = os.environ.get("TRACEML_TORCH_PYTHON", "/root/.cache/traceml/venv-torch-py3.11/bin/python")
d = f"/tmp/traceml-ledger-job-{os.getpid()}"
os.makedirs(d, exist_ok=True)
# The dataset holds every step's batch (64 x 256 floats, 64 KiB): enough steps for the schedule
# at 2 ms a step (steps here take 4-10 ms on 2 cores) plus 60 s of attaches.
steps = int((5 + (2 * on_windows + 1) * window_s + 60) * 500)
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
tr = subprocess.Popen([os.path.join(os.path.dirname(py), "torchrun"), f"--nproc_per_node={n}", f"--master_port={port}",
                       f"{ws}/tests/workloads/ddp/ddp_train.py", "--truth-dir", d, "--ready", f"{d}/ready", "--mode", "ddp",
                       "--steps", str(steps), "--batch-size", "64"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
now = time.monotonic_ns


def stop_job():
    # The ranks lead sessions of their own: each is killed by its pid, then the launcher.
    for r in range(n):
        try:
            os.kill(json.load(open(f"{d}/rank{r}.pid"))["pid"], signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass
    try:
        os.killpg(tr.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


try:
    t = time.time()
    while not all(os.path.exists(f"{d}/rank{r}.pid") for r in range(n)):
        assert time.time() - t < 180 and tr.poll() is None, "ranks not ready"
        time.sleep(0.1)
    open(f"{d}/ready", "w").write("go\n")
    time.sleep(5)  # warm-up
    spans, joined = [], []
    for i in range(2 * on_windows + 1):
        if i % 2 == 0:
            t0 = now(); time.sleep(window_s); spans.append(("off", t0, now()))
            continue
        out = f"{d}/out{i}"
        err = open(f"{d}/daemon{i}.err", "w")
        dm = subprocess.Popen([daemon, "--pid", str(tr.pid), "--duration", str(window_s + 3), "--output", out,
                               "--color", "never", "--quiet"], stdout=subprocess.DEVNULL, stderr=err,
                              env=dict(os.environ, RUST_LOG="info"))
        t = time.time()
        while open(f"{d}/daemon{i}.err").read().count("target: attached to ") < n:
            assert time.time() - t < 120 and dm.poll() is None, open(f"{d}/daemon{i}.err").read()[-3000:]
            time.sleep(0.05)
        t0 = now()
        dm.wait()
        spans.append(("on", t0, now()))
        try:
            summary = json.load(open(f"{out}/final_summary.json"))
            cw = summary.get("collective_waits") or {}
            joined.append(cw.get("compared"))
        except (OSError, ValueError):
            joined.append(None)
        time.sleep(1)
finally:
    stop_job()
ends = [int(line.split()[1]) for line in open(f"{d}/progress-rank0.log") if len(line.split()) == 2]
windows = []
for kind, a, b in spans:
    steps = [(y - x) / 1e6 for x, y in zip(ends, ends[1:]) if x >= a and y <= b]
    windows.append({"kind": kind, "steps": len(steps), "median_ms": statistics.median(steps) if steps else None})
ratios = []
for i, w in enumerate(windows):
    if w["kind"] == "on" and 0 < i < len(windows) - 1:
        offs = [windows[i - 1]["median_ms"], windows[i + 1]["median_ms"]]
        if w["median_ms"] and all(offs):
            ratios.append(w["median_ms"] / (sum(offs) / 2))
print(json.dumps({"ranks": n, "window_s": window_s, "windows": windows, "ratios": ratios, "joined": joined}))
