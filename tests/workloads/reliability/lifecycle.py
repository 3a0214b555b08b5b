"""Workloads of the reliability tests (traceml-daemon/tests/reliability.rs).

Every mode loads the stand-in CUDA runtime (--lib), prints {"pid": ...} once loaded (the harness
attaches the daemon then), waits for --ready, and does an exactly known amount of probed work:
`batches(n)` iterates the DataLoader stand-in n times (n + 1 calls of __next__, the last raising
StopIteration) and makes `launches` cudaLaunchKernel calls per batch, plus one H2D cudaMemcpy and
one D2H cudaMemcpy whose round trip is checked byte for byte (the target must compute correctly
whatever the daemon does). Each mode prints its truth as one JSON line {"truth": {...}}.

Modes:
  exit      one phase, then exit with status --code (default 0), or kill itself with --signal N
            (the default action: SIGTERM and SIGKILL end it, SIGABRT also dumps core).
  steady    batches until the file --stop exists; after --after exists (the test killed or stopped
            the daemon), `--tail` more batches. Prints {"running": 1} after --warm batches so the
            test knows probes are being hit. The result is a checksum over every batch, which the
            test recomputes from the batch count.
  threads   --threads Python threads started after attach, one after the other and each ended
            before the next starts, each making --per-thread cudaLaunchKernel calls; their native
            thread ids are in the truth.
  fork      one phase in the parent; then a forked child does its own batches and reports its
            checksum through a pipe; then the parent does one more phase and exits.
  exec      one phase, then the process execs /bin/sh, which waits for --stop.
  phases    one phase per file in --gates: waits for the gate, runs a phase, prints a truth line.
  flood     calls flood() of libflood.so (--flood-lib): --threads pthreads x --per-thread
            cudaLaunchKernel from C, then sleeps --settle s so the daemon drains, then exits.
"""
import argparse
import ctypes
import json
import os
import sys
import threading
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "countpkg"))
from torch.utils.data.dataloader import _BaseDataLoaderIter  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("mode")
ap.add_argument("--ready", required=True)
ap.add_argument("--lib", required=True)
ap.add_argument("--iters", type=int, default=10)
ap.add_argument("--launches", type=int, default=3)
ap.add_argument("--bytes", type=int, default=4096)
ap.add_argument("--stop")
ap.add_argument("--after")
ap.add_argument("--warm", type=int, default=20)
ap.add_argument("--tail", type=int, default=100)
ap.add_argument("--threads", type=int, default=3)
ap.add_argument("--per-thread", type=int, default=50)
ap.add_argument("--gates", nargs="*", default=[])
ap.add_argument("--flood-lib")
ap.add_argument("--settle", type=float, default=1.0)
ap.add_argument("--code", type=int, default=0)
ap.add_argument("--signal", type=int, default=0)
ap.add_argument("--big-mib", type=int, default=0, help="touch this much anonymous memory first")
a = ap.parse_args()


class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


lib = ctypes.CDLL(a.lib)
lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
lib.cudaLaunchKernel.argtypes = [ctypes.c_void_p, dim3, dim3, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p]
KERNEL = ctypes.c_void_p(1)  # any non-null function pointer
GRID, BLOCK = dim3(1, 1, 1), dim3(32, 1, 1)
dev = ctypes.c_void_p()
if lib.cudaMalloc(ctypes.byref(dev), a.bytes) != 0:
    sys.exit("cudaMalloc failed")
src = ctypes.create_string_buffer(a.bytes)
dst = ctypes.create_string_buffer(a.bytes)


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.01)


def launch():
    rc = lib.cudaLaunchKernel(KERNEL, GRID, BLOCK, None, 0, None)
    if rc != 0:
        sys.exit(f"cudaLaunchKernel returned {rc}")


def batch(i):
    """One batch: a known payload to the device and back, checked; returns the batch's value."""
    pattern = bytes((i * 7 + j) & 0xFF for j in range(256))
    ctypes.memmove(src, pattern * (a.bytes // 256), a.bytes // 256 * 256)
    for _ in range(a.launches):
        launch()
    if lib.cudaMemcpy(dev, src, a.bytes, 1) != 0 or lib.cudaMemcpy(dst, dev, a.bytes, 2) != 0:
        sys.exit("cudaMemcpy failed")
    if dst.raw != src.raw:
        sys.exit(f"batch {i}: device round trip corrupted the data")
    return (i * i + 3 * i) % 1_000_003


def phase(n):
    """n batches through the DataLoader stand-in; returns (truth counts, checksum)."""
    total = 0
    for i in _BaseDataLoaderIter(n):
        total = (total + batch(i)) % 1_000_000_007
    return {"next_calls": n + 1, "launch": n * a.launches, "memcpy": 2 * n}, total


def say(obj):
    print(json.dumps(obj), flush=True)


big = None
if a.big_mib:
    import mmap
    big = mmap.mmap(-1, a.big_mib << 20)
    for off in range(0, a.big_mib << 20, 4096):
        big[off] = 1
say({"pid": os.getpid()})
wait_for(a.ready)

if a.mode == "exit":
    counts, total = phase(a.iters)
    say({"truth": dict(counts, checksum=total)})
    if a.signal:
        import signal
        if a.signal not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(a.signal, signal.SIG_DFL)
        os.kill(os.getpid(), a.signal)
        time.sleep(60)
    sys.exit(a.code)
elif a.mode == "steady":
    n, total, tail = 0, 0, None
    while tail is None or tail > 0:
        n += 1
        total = (total + batch(n)) % 1_000_000_007
        if n == a.warm:
            say({"running": 1})
        if tail is None and a.after and os.path.exists(a.after):
            tail = a.tail
        elif tail is not None:
            tail -= 1
        if a.stop and os.path.exists(a.stop):
            break
    say({"truth": {"batches": n, "launch": n * a.launches, "checksum": total}})
elif a.mode == "threads":
    tids = []

    def work():
        tids.append(threading.get_native_id())
        for _ in range(a.per_thread):
            launch()

    main_before = phase(a.iters)[0]
    for _ in range(a.threads):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    main_after = phase(a.iters)[0]
    say({"truth": {"main_tid": threading.get_native_id(), "thread_tids": tids, "per_thread": a.per_thread,
                   "main_launch": main_before["launch"] + main_after["launch"]}})
elif a.mode == "fork":
    before, c1 = phase(a.iters)
    r, w = os.pipe()
    warnings.simplefilter("ignore", DeprecationWarning)  # fork with the runtime's thread: known, fine here
    child = os.fork()
    if child == 0:
        os.close(r)
        # The stand-in runtime refuses a forked child, like the real one: the child does Python
        # work only, and reports it.
        total = 0
        for i in _BaseDataLoaderIter(a.iters):
            total = (total + (i * i + 3 * i) % 1_000_003) % 1_000_000_007
        os.write(w, json.dumps({"pid": os.getpid(), "checksum": total}).encode())
        os._exit(0)
    os.close(w)
    reply = b""
    while chunk := os.read(r, 4096):
        reply += chunk
    _, status = os.waitpid(child, 0)
    after, c2 = phase(a.iters)
    say({"truth": {"launch": before["launch"] + after["launch"], "next_calls": before["next_calls"] + after["next_calls"],
                   "child": json.loads(reply), "child_status": status, "checksum": (c1 + c2) % 1_000_000_007}})
elif a.mode == "exec":
    counts, total = phase(a.iters)
    say({"truth": dict(counts, checksum=total)})
    sh = "/bin/sh"
    os.execv(sh, [sh, "-c", 'while [ ! -e "$0" ]; do sleep 0.05; done; echo \'{"execed": 1}\'', a.stop])
elif a.mode == "phases":
    for k, gate in enumerate(a.gates):
        wait_for(gate)
        counts, total = phase(a.iters)
        say({"truth": dict(counts, checksum=total, phase=k)})
elif a.mode == "flood":
    fl = ctypes.CDLL(a.flood_lib)
    fl.flood.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64]
    fl.flood.restype = ctypes.c_int64
    ok = fl.flood(a.lib.encode(), a.threads, a.per_thread)
    # No Python frames from here until the daemon has drained: time.sleep runs in this frame.
    time.sleep(a.settle)
    say({"truth": {"launch": a.threads * a.per_thread, "ok": ok}})
else:
    sys.exit(f"unknown mode {a.mode}")
