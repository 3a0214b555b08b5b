"""Exact-count workload for the attach tests.

Waits for --ready, then (optionally) loads the CUDA runtime library, waits --settle seconds so the
daemon can notice it, and makes a known number of calls: --iters batches from a DataLoader-like
iterator (so --iters + 1 calls of __next__, the last raising StopIteration), and per batch one
H2D cudaMemcpy and one D2H cudaMemcpyAsync of --bytes bytes, --launches cudaLaunchKernel calls and
one cudaStreamSynchronize; one cudaDeviceSynchronize at the end. Return codes are ignored: the
real libcudart returns cudaErrorInsufficientDriver (35) without a GPU, which is fine.
Prints its truth as one JSON line at the end.
"""
import argparse
import ctypes
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "countpkg"))
from torch.utils.data.dataloader import _BaseDataLoaderIter  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--ready", required=True)
ap.add_argument("--lib", required=True)
ap.add_argument("--late-load", action="store_true")
ap.add_argument("--settle", type=float, default=0.0)
ap.add_argument("--iters", type=int, default=10)
ap.add_argument("--bytes", type=int, default=4096)
ap.add_argument("--launches", type=int, default=3)
a = ap.parse_args()


class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def load():
    lib = ctypes.CDLL(a.lib)
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudaLaunchKernel.argtypes = [ctypes.c_void_p, dim3, dim3, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p]
    lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    return lib


lib = None if a.late_load else load()
# The harness attaches the daemon after this line: everything loaded so far is there to see.
print(json.dumps({"pid": os.getpid()}), flush=True)
while not os.path.exists(a.ready):
    time.sleep(0.01)
if lib is None:
    lib = load()
time.sleep(a.settle)

dev = ctypes.c_void_p()
lib.cudaMalloc(ctypes.byref(dev), a.bytes)
host = ctypes.create_string_buffer(a.bytes)
calls = {"next": 0, "h2d": 0, "d2h": 0, "launch": 0, "stream_sync": 0, "device_sync": 0}
for _ in _BaseDataLoaderIter(a.iters):
    calls["next"] += 1
    lib.cudaMemcpy(dev, host, a.bytes, 1)
    calls["h2d"] += 1
    for _ in range(a.launches):
        lib.cudaLaunchKernel(None, dim3(1, 1, 1), dim3(32, 1, 1), None, 0, None)
        calls["launch"] += 1
    lib.cudaMemcpyAsync(host, dev, a.bytes, 2, None)
    calls["d2h"] += 1
    lib.cudaStreamSynchronize(None)
    calls["stream_sync"] += 1
lib.cudaDeviceSynchronize()
calls["device_sync"] += 1
# the loop made `iters` batches plus the __next__ that raised StopIteration
calls["next_calls"] = calls.pop("next") + 1
calls["bytes"] = a.bytes
print(json.dumps({"truth": calls}), flush=True)
