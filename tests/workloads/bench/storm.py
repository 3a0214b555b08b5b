"""Bench workload: probe-hit storms, to measure the time each probe hit adds (with vs without
traceml-daemon attached). Uses the fake torch package's native halves and the stand-in CUDA
runtime (tests/build.sh).

Usage: python storm.py --mode MODE [--n N] [--reps R] [--ready FILE]
  pyframe  list(map(f, range(N))): N entries of _PyEval_EvalFrameDefault from C (each an
           uninteresting code object: py_enter + its return probe)
  module   N calls of a torch.nn.Module with an empty forward (interesting frames: classified,
           an event per entry and exit)
  launch   N ctypes calls of cudaLaunchKernel (0 ns kernels)
  sync     N ctypes calls of cudaStreamSynchronize on an idle device (call enter + exit)
  record   N pairs of record_function enter/exit through the native entry points
  vendor   N calls of the stand-in vendor library's GEMM (libfakeblasLt: one 0 ns kernel each,
           launched by its own runtime copy through its cuGetProcAddress'd cuLaunchKernel: the
           driver's launch probe, its caller read and looked up)
  vendor_internal  the same with FAKECUDA_PROCADDR=internal: the pointers are the stand-in
           driver's internal implementations, which the daemon follows (the library initialises
           after --ready, then waits 0.5 s for the daemon to place the probes)
  procaddr N calls of the driver's cuGetProcAddress_v2 for cuLaunchKernel (its entry and return
           probe, an event each, the daemon's look at the pointer)
First stdout line {"pid": ...}; after --ready exists, runs R repetitions and prints
{"mode", "n", "ns_per_call": [...], "median"} (ns per call; hits per call in the docs).
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "faketorch"))

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=["pyframe", "module", "launch", "sync", "record", "vendor",
                                   "vendor_internal", "procaddr"], required=True)
ap.add_argument("--n", type=int, default=200_000)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--ready")
ap.add_argument("--truth", help="accepted for the common protocol; unused")
a = ap.parse_args()
print(json.dumps({"pid": os.getpid(), "mode": a.mode}), flush=True)
if a.mode == "vendor_internal":
    os.environ["FAKECUDA_PROCADDR"] = "internal"  # read when the stand-in driver initialises

import torch  # noqa: E402  (fake torch: loads libtorch_*.so and the stand-in libcudart)
from torch import _C  # noqa: E402

lib = _C.cudart()
lib.fakecuda_set_kernel_ns(0)
launch = lib.cudaLaunchKernel
sync = lib.cudaStreamSynchronize
rf_enter = _C._torch_python.faketorch_record_function_enter
rf_exit = _C._torch_python.faketorch_record_function_exit
kernel, grid, block = _C._kernel, _C._GRID, _C._BLOCK


def f(x):
    return x


class Empty(torch.nn.Module):
    def forward(self, x):
        return x


mod = Empty()
name = b"bench::storm"

if a.ready:
    while not os.path.exists(a.ready):
        time.sleep(0.01)

if a.mode in ("vendor", "vendor_internal"):
    blas = _C.blas()
    blas.fakeblas_init()  # its own runtime copy asks the driver for its entry points
    time.sleep(0.5)
    gemm = blas.fakeblas_gemm
elif a.mode == "procaddr":
    drv = ctypes.CDLL(os.path.join(os.path.dirname(_C.CUDART_PATH), "libcuda.so.1"))
    getproc = drv.cuGetProcAddress_v2
    getproc.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                        ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    drv.cuInit(0)
    pfn, status = ctypes.c_void_p(), ctypes.c_int()

res = []
for _ in range(a.reps):
    n = a.n
    t0 = time.perf_counter_ns()
    if a.mode == "pyframe":
        list(map(f, range(n)))
    elif a.mode == "module":
        for i in range(n):
            mod(i)
    elif a.mode == "launch":
        for _ in range(n):
            launch(kernel, grid, block, None, 0, None)
    elif a.mode == "sync":
        for _ in range(n):
            sync(None)
    elif a.mode in ("vendor", "vendor_internal"):
        for _ in range(n):
            gemm(1, 0, None)
    elif a.mode == "procaddr":
        for _ in range(n):
            getproc(b"cuLaunchKernel", ctypes.byref(pfn), 13000, 0, ctypes.byref(status))
    else:
        for _ in range(n):
            rf_exit(rf_enter(name, 12))
    res.append((time.perf_counter_ns() - t0) / n)
    if a.mode in ("launch", "vendor", "vendor_internal"):
        lib.cudaDeviceSynchronize()
print(json.dumps({"mode": a.mode, "n": a.n, "ns_per_call": [round(x, 1) for x in res],
                  "median": round(statistics.median(res), 1)}), flush=True)
