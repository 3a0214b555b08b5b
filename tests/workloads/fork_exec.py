"""A process that starts its training child the way a launcher does: fork, then (after --pause
seconds, so that a node scan sees the child as the parent's copy) exec input_bound_single.py
for --steps N (truth to --truth). The parent imports the stand-in torch first, as torchrun's
agent has torch loaded, and waits for the child. Usage:
  python fork_exec.py --steps N --truth T [--pause S]"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
import torch  # noqa: E402,F401  (the stand-in: maps libtorch, as torchrun's agent has torch)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--truth", required=True)
ap.add_argument("--pause", type=float, default=1.0)
a = ap.parse_args()
pid = os.fork()
if pid == 0:
    time.sleep(a.pause)
    script = os.path.join(HERE, "input_bound_single.py")
    os.execv(sys.executable, [sys.executable, script, "--steps", str(a.steps),
                              "--truth", a.truth])
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
