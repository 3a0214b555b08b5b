"""Attach and stop at node scale on an N-rank gloo DDP job (tests/workloads/ddp/ddp_train.py,
ranks still running at the stop). Usage, as root:
    python3 stop_job.py WORKSPACE DAEMON N WAIT_S [pid|serve]  (TRACEML_UPROBE_LINKS=perf: old way)
`pid` (default): `traceml-daemon --pid <torchrun launcher>`, stopped with SIGINT. `serve`:
`traceml-daemon serve --include '*ddp_train.py --truth-dir <this run's> *'` (this job only) started once the ranks run, stopped with SIGTERM.
Prints one JSON line: the time from the daemon's start until every rank is attached, signal to
summary and to exit, ranks alive at the exit (`cargo xtask bench --ranks-only` reads it)."""
import os, signal, subprocess, sys, time, json, socket, re
ws, daemon, n, wait_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
mode = sys.argv[5] if len(sys.argv) > 5 else "pid"
py = os.environ.get("TRACEML_TORCH_PYTHON", "/root/.cache/traceml/venv-torch-py3.11/bin/python")
d = f"/tmp/traceml-stop-job-{os.getpid()}"
os.makedirs(d, exist_ok=True)
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
tr = subprocess.Popen([os.path.join(os.path.dirname(py), "torchrun"), f"--nproc_per_node={n}", f"--master_port={port}",
    f"{ws}/tests/workloads/ddp/ddp_train.py", "--truth-dir", d, "--ready", f"{d}/ready", "--mode", "ddp", "--steps", "5000", "--batch-size", "64"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
t = time.time()
while not all(os.path.exists(f"{d}/rank{r}.pid") for r in range(n)):
    assert time.time() - t < 180, "ranks not ready"; time.sleep(0.1)
ranks = [json.load(open(f"{d}/rank{r}.pid"))["pid"] for r in range(n)]
err = open(f"{d}/daemon.err", "w")
t0 = time.time()
if mode == "serve":
    # The ranks wait for --ready; serve writes its ready file once it scans, not per rank.
    open(f"{d}/ready", "w").write("go\n")
    cmd = [daemon, "serve", "--state-dir", f"{d}/state", "--config", f"{d}/none.toml", "--window", "60",
           "--scan-interval", "0.2", "--include", f"*ddp_train.py --truth-dir {d} *"]
    open(f"{d}/none.toml", "w").write("")
else:
    cmd = [daemon, "--pid", str(tr.pid), "--ready-file", f"{d}/ready", "--output", f"{d}/out", "--color", "never", "--quiet"]
dm = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ, RUST_LOG="info"))
while open(f"{d}/daemon.err").read().count("target: attached to ") < n:
    assert time.time() - t0 < 240 and dm.poll() is None, open(f"{d}/daemon.err").read()[-3000:]; time.sleep(0.1)
t_att = time.time() - t0
time.sleep(wait_s)
ts = time.time(); dm.send_signal(signal.SIGTERM if mode == "serve" else signal.SIGINT)
t_sum = None
while dm.poll() is None:
    if t_sum is None and ("summary written" in open(f"{d}/daemon.err").read() or (mode == "serve" and "stopping: detaching" in open(f"{d}/daemon.err").read())): t_sum = time.time() - ts
    time.sleep(0.01)
stop = time.time() - ts
alive = sum(1 for p in ranks if os.path.exists(f"/proc/{p}"))
os.killpg(tr.pid, signal.SIGTERM)
try: tr.wait(timeout=20)
except Exception: os.killpg(tr.pid, signal.SIGKILL)
log = open(f"{d}/daemon.err").read()
det = re.findall(r"probes detached.*", log)
print(json.dumps({"mode": mode, "ranks": n, "links_env": os.environ.get("TRACEML_UPROBE_LINKS", "auto"), "attach_all_s": round(t_att, 2),
  "sigint_to_exit_s": round(stop, 2), "sigint_to_summary_s": t_sum and round(t_sum, 2), "ranks_alive_at_exit": alive, "rc": dm.returncode, "detached": det}))
