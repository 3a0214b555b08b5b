"""A training process that restarts itself in place: the input_bound_single scenario for --steps
N (truth to --truth), then os.execv of the same interpreter on input_bound_single.py for
--steps-after M (truth to --truth-after): one pid, two programs, two runs — as a job that
re-executes itself after a failure or a config reload. Usage:
  python exec_restart.py --steps N --truth T1 --steps-after M --truth-after T2"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import groundtruth  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--truth", required=True)
ap.add_argument("--steps-after", type=int, required=True)
ap.add_argument("--truth-after", required=True)
a = ap.parse_args()
groundtruth.run("exec_restart", dict(steps=a.steps, batch_size=2, getitem_ns=15_000_000,
                                     verdict="input_bound"),
                argparse.Namespace(ready=None, truth=a.truth, steps=a.steps))
sys.stdout.flush()
script = os.path.join(HERE, "input_bound_single.py")
os.execv(sys.executable, [sys.executable, script, "--steps", str(a.steps_after),
                          "--truth", a.truth_after])
