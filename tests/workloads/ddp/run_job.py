"""Reference harness for ddp_train.py: start a torchrun job, find its ranks, release them, wait.

    python3 run_job.py --torchrun PATH --nproc N --out DIR [--timeout S] [--hang-hold S] \
        -- [ddp_train.py options, without --truth-dir/--ready]

1. starts `torchrun --nproc_per_node=N --master_port=<free port> ddp_train.py --truth-dir DIR
   --ready DIR/ready ...` (stdout/stderr to DIR/stdout.log, DIR/stderr.log; torchrun 2.15 does
   not prefix the ranks' lines unless --tee/--log-dir is given, so the JSON lines arrive as is);
2. waits for DIR/rank<R>.pid of every rank (written once the rank is ready to wait) and prints
   one JSON line: {"torchrun_pid": P, "ranks": [{"rank", "local_rank", "pid", "tid", "ppid"}, ...]}
   — this is where a test attaches the daemon (to torchrun_pid or to any rank's pid);
3. creates DIR/ready, then waits for the job to exit; with --hang-rank in the options it instead
   waits until every rank has written its truth (status hung/blocked), holds --hang-hold seconds,
   checks every rank is still alive (the job is hung, not dead), then SIGTERMs torchrun;
4. prints summarize.py's table for DIR. Exit status: torchrun's (0), or 1 on a failed check.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import summarize  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torchrun", default=os.environ.get("TRACEML_TORCHRUN", "torchrun"))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--hang-hold", type=float, default=3.0)
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    rest = [x for x in a.rest if x != "--"]
    os.makedirs(a.out, exist_ok=True)
    ready = os.path.join(a.out, "ready")
    if os.path.exists(ready):
        os.unlink(ready)
    cmd = [a.torchrun, "--nproc_per_node=%d" % a.nproc, "--master_port=%d" % free_port(),
           os.path.join(HERE, "ddp_train.py"), "--truth-dir", a.out, "--ready", ready] + rest
    with open(os.path.join(a.out, "stdout.log"), "w") as so, open(os.path.join(a.out, "stderr.log"), "w") as se:
        job = subprocess.Popen(cmd, stdout=so, stderr=se)
    deadline = time.monotonic() + a.timeout
    pidfiles = [os.path.join(a.out, "rank%d.pid" % r) for r in range(a.nproc)]
    while not all(os.path.exists(p) for p in pidfiles):
        if job.poll() is not None or time.monotonic() > deadline:
            job.kill()
            raise SystemExit("job exited or timed out before every rank was ready (see %s)" % a.out)
        time.sleep(0.05)
    ranks = [json.load(open(p)) for p in pidfiles]
    print(json.dumps({"torchrun_pid": job.pid, "ranks": [{k: r[k] for k in ("rank", "local_rank", "pid", "tid",
                                                                             "ppid")} for r in ranks]}), flush=True)
    open(ready, "w").close()
    rc, failed = None, False
    if "--hang-rank" in rest:
        truths = [os.path.join(a.out, "truth-rank%d.json" % r) for r in range(a.nproc)]
        while not all(os.path.exists(p) for p in truths):
            if job.poll() is not None or time.monotonic() > deadline:
                failed = True
                break
            time.sleep(0.05)
        time.sleep(a.hang_hold)
        still = {r["rank"]: alive(r["pid"]) for r in ranks}
        print(json.dumps({"hung_job_alive": still}), flush=True)
        failed = failed or not all(still.values())
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(30)
        except subprocess.TimeoutExpired:
            job.kill()
        for r in ranks:  # a rank blocked in C++ may outlive torchrun's SIGTERM
            if alive(r["pid"]):
                os.kill(r["pid"], signal.SIGKILL)
        rc = 0
    else:
        try:
            rc = job.wait(max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            job.kill()
            rc = 124
    res = summarize.summarize(a.out)
    print(json.dumps({"torchrun_rc": rc, "problems": res["problems"]}), flush=True)
    subprocess.call([sys.executable, os.path.join(HERE, "summarize.py"), a.out])
    sys.exit(1 if (rc or failed or res["problems"]) else 0)


if __name__ == "__main__":
    main()
