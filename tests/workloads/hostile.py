"""A residual-heavy training loop whose every name is hostile (traceml-daemon/tests/hostile.rs).

On the fake torch and the stand-in CUDA runtime (FAKECUDA_LIB may point at a copy in a directory
with a hostile name). Before printing its start line the process renames itself (prctl
PR_SET_NAME, with an escape sequence and invalid UTF-8) and maps a file whose name is invalid
UTF-8 with an escape sequence. Then:

- the dataset class is named "\\x1b[2J" + "W" * 100000, and its __getitem__ is a function whose
  code object was renamed (co_name, co_qualname, co_filename) to HTML/JS and escape sequences;
- the optimizer class has an OSC title sequence as its name (it ends up in record_function names);
- after every step the loop calls a function whose code object's qualname is 16 MB long and
  starts with an OSC sequence, from a "file" named with an OSC 8 hyperlink and a bidi override:
  it sleeps 40 ms, so the residual dominates and the verdict, RESIDUAL-HEAVY, quotes it.

Usage: python hostile.py --ready FILE [--steps N] [--map FILE] [anything: ignored]
Prints {"pid": ...} once set up, waits for --ready, trains, prints {"done": N, "log_ns": time in
the residual function, "wall_ns": the loop's wall time from its first batch}.
"""
import argparse
import ctypes
import json
import mmap
import os
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "faketorch"))

ap = argparse.ArgumentParser()
ap.add_argument("--ready", required=True)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--map", help="a directory: a file with a hostile, non-UTF-8 name is mapped from it")
a, _ = ap.parse_known_args()

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

MARKUP = "\x1b[2J\x1b[H\x1b]0;pwned\x07<script>alert(1)</script>"
HUGE = "\x1b]0;title\x07" + "Q" * (16 << 20)


def renamed(fn, name, qualname, filename):
    """`fn` with its code object renamed, as a new function."""
    fields = dict(co_name=name, co_filename=filename)
    if sys.version_info >= (3, 11):
        fields["co_qualname"] = qualname
    code = fn.__code__.replace(**fields)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _init(self, n):
    self.n = n


def _len(self):
    return self.n


def _getitem(self, i):
    time.sleep(0.0005)
    return torch.empty(1024), torch.empty(1)


HostileDataset = type("\x1b[2J" + "W" * 100000, (Dataset,), {
    "__init__": _init,
    "__len__": _len,
    "__getitem__": renamed(_getitem, "\x1b[31m<b>getitem", MARKUP + ".__getitem__",
                           "/tmp/\x1b[31m<img src=x onerror=alert(1)>.py"),
})


def _log_step():
    time.sleep(0.04)


log_step = renamed(_log_step, "\x1b]0;log\x07", HUGE,
                   "\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\/evil\u202eyp.py")
HostileSGD = type("\x1b]0;opt\x07", (torch.optim.SGD,), {})

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).cuda()
lossf = torch.nn.MSELoss()
opt = HostileSGD(model.parameters(), lr=0.01)
loader = DataLoader(HostileDataset(a.steps * 2), batch_size=2)

# comm: 15 bytes at most, an escape sequence and invalid UTF-8.
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(15, b"\x1b[2J\xff\xfe<x>", 0, 0, 0) != 0:  # PR_SET_NAME
    sys.exit(f"prctl: errno {ctypes.get_errno()}")
mapped = None
if a.map:
    path = os.path.join(os.fsencode(a.map), b"lib\x1b[2J\xff.so")
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)

print(json.dumps({"pid": os.getpid()}), flush=True)
while not os.path.exists(a.ready):
    time.sleep(0.01)

steps = 0
log_ns = 0
t_first = None
for x, y in loader:
    if t_first is None:
        t_first = time.monotonic_ns()
    with torch.autograd.profiler.record_function("\x1b[2J<script>x</script>"):
        xd = x.to("cuda", non_blocking=True)
        yd = y.to("cuda", non_blocking=True)
    out = model(xd)
    loss = lossf(out, yd)
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss.item()
    t = time.monotonic_ns()
    log_step()
    log_ns += time.monotonic_ns() - t
    steps += 1
# The truth the verdict is held to: the time in log_step (all of it residual) against the wall
# time of the loop from the first batch on.
wall_ns = time.monotonic_ns() - t_first if t_first is not None else 0
print(json.dumps({"done": steps, "log_ns": log_ns, "wall_ns": wall_ns}), flush=True)
