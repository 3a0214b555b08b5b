"""Self-check of the stand-in driver paths: python3 tests/fakecuda/selfcheck.py [BUILD_DIR]

1. Static: the runtimes (libcudart.so.12/.13, cet/), libfakeblasLt.so.13 and the Triton launcher
   have no DT_NEEDED on libcuda/libcudart and import no cu*/cuda* symbol (readelf -d, nm -D).
2. Names: every cu* entry point the stand-in driver exports (base name without _v2/_ptsz) is a
   name the real CUDA 13 runtime / cuBLASLt request (strings in their .rodata), when the torch
   venv is there (else skipped with a message).
3. Dynamic, in a fresh process per FAKECUDA_PROCADDR mode (default, internal): N launches through
   each layer (runtime cudaLaunchKernel / cudaLaunchKernelExC / cudaLaunchCooperativeKernel /
   cudaGraphLaunch, vendor fakeblas_gemm / fakeblas_conv, Triton faketriton_launch /
   faketriton_launch_static); the driver's launches_driver equals the layers' own counts summed,
   each per-path counter equals its layer's count, procaddr_internal is 0 (default) or > 0
   (internal), cuGetProcAddress honours the per-thread flag (_ptsz), and kernel time adds up.
Exit status 1 on any failure."""
import ctypes
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else \
    os.path.join(os.path.dirname(HERE), "build", "fakecuda")
REAL = "/root/.cache/traceml/venv-torch-py3.11/lib/python3.11/site-packages/nvidia/cu13/lib"
FIELDS = ["version", "launch_kernel", "launch_kernel_ex", "graph_launch", "memcpy_calls",
          "memcpy_async_calls", "bytes_h2h", "bytes_h2d", "bytes_d2h", "bytes_d2d", "copies_h2d",
          "copies_d2h", "stream_sync", "device_sync", "event_sync", "event_record",
          "kernel_ns_enqueued", "kernel_ns_executed", "copy_ns_executed", "ops_enqueued",
          "ops_completed", "host_blocked_ns", "malloc_calls", "free_calls", "malloc_host_calls",
          "free_host_calls", "api_calls", "launches_runtime", "launches_library", "launches_direct",
          "launches_driver", "coop_launch", "memcpy_peer_calls", "procaddr_calls", "procaddr_internal"]
fails = []


def fail(msg):
    fails.append(msg)
    print("FAIL", msg)


def static_checks():
    for lib in ("libcudart.so.12", "libcudart.so.13", "cet/libcudart.so.12", "libfakeblasLt.so.13",
                "libfaketriton_launcher.so"):
        p = os.path.join(BUILD, lib)
        needed = subprocess.run(["readelf", "-d", p], capture_output=True, text=True).stdout
        if re.search(r"NEEDED.*\[libcuda(rt)?\.so", needed):
            fail(f"{lib}: DT_NEEDED on libcuda/libcudart")
        und = subprocess.run(["nm", "-D", "--undefined-only", p], capture_output=True, text=True).stdout
        bad = [ln.split()[-1] for ln in und.splitlines() if re.match(r"_*cu", ln.split()[-1])]
        if bad:
            fail(f"{lib}: imports {bad}")
    s = subprocess.run(["strings", "-n", "8", os.path.join(BUILD, "libfakeblasLt.so.13")],
                       capture_output=True, text=True).stdout.split()
    for want in ("libcuda.so.1", "cuGetProcAddress"):
        if want not in s:
            fail(f"libfakeblasLt.so.13: no string {want!r}")
    print("static: no libcuda/libcudart link, no cu*/cuda* import: checked")


# Real libcuda exports of ours that these two libraries do not request (they use cuMemHostAlloc).
NOT_REQUESTED = {"cuMemAllocHost_v2"}


def real_names():
    ours = subprocess.run(["nm", "-D", "--defined-only", os.path.join(BUILD, "libcuda.so.1")],
                          capture_output=True, text=True).stdout.split()
    ours = sorted(n for n in ours if n.startswith("cu"))
    libs = [os.path.join(REAL, n) for n in ("libcudart.so.13", "libcublasLt.so.13")]
    if not all(os.path.exists(p) for p in libs):
        print(f"names: SKIPPED (no real CUDA 13 libraries under {REAL})")
        return
    for p in libs:
        names = set(subprocess.run(["strings", "-n", "6", p], capture_output=True, text=True).stdout.split())
        missing = [n for n in ours if n not in names and n not in NOT_REQUESTED]
        if missing:
            fail(f"{os.path.basename(p)} does not request {missing}")
        else:
            print(f"names: {len(ours) - len(NOT_REQUESTED)} of our {len(ours)} driver exports are names "
                  f"{os.path.basename(p)} requests (not: {sorted(NOT_REQUESTED)})")


CHILD = r'''
import ctypes, os, sys, json
B = sys.argv[1]
N = 7
rt = ctypes.CDLL(os.path.join(B, "libcudart.so.12"))
class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
class cfg_t(ctypes.Structure):
    _fields_ = [("grid", dim3), ("block", dim3), ("smem", ctypes.c_size_t), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("nattrs", ctypes.c_uint)]
vp = ctypes.c_void_p
rt.cudaLaunchKernel.argtypes = [vp, dim3, dim3, vp, ctypes.c_size_t, vp]
ulk = getattr(rt, "__cudaLaunchKernel")
ulk.argtypes = [vp, dim3, dim3, vp, ctypes.c_size_t, vp]
rt.cudaLaunchCooperativeKernel.argtypes = [vp, dim3, dim3, vp, ctypes.c_size_t, vp]
rt.cudaLaunchKernelExC.argtypes = [ctypes.POINTER(cfg_t), vp, vp]
rt.cudaGraphLaunch.argtypes = [vp, vp]
rt.fakecuda_set_kernel_ns.argtypes = [ctypes.c_uint64]
rt.fakecuda_stats.argtypes = [vp, ctypes.c_size_t]
rt.fakecuda_stats.restype = ctypes.c_size_t
rt.fakecuda_set_kernel_ns(1000)
g, b = dim3(1, 1, 1), dim3(32, 1, 1)
c = cfg_t(g, b, 0, None, None, 0)
for _ in range(N):
    assert rt.cudaLaunchKernel(vp(0x1234), g, b, None, 0, None) == 0
    assert ulk(vp(0x1234), g, b, None, 0, None) == 0
    assert rt.cudaLaunchKernelExC(ctypes.byref(c), vp(0x1234), None) == 0
    assert rt.cudaLaunchCooperativeKernel(vp(0x1234), g, b, None, 0, None) == 0
    assert rt.cudaGraphLaunch(vp(0x99), None) == 0
blas = ctypes.CDLL(os.path.join(B, "libfakeblasLt.so.13"))
tri = ctypes.CDLL(os.path.join(B, "libfaketriton_launcher.so"))
for f in (blas.fakeblas_gemm, blas.fakeblas_conv, tri.faketriton_launch, tri.faketriton_launch_static):
    f.argtypes = [ctypes.c_int, ctypes.c_ulonglong, vp]
    assert f(N, 2000, None) == 0, f
assert blas.fakeblas_sync(None) == 0
drv = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
gpa = drv.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(vp), ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
ptrs = {}
for name, flags in (("cuLaunchKernel", 0), ("cuLaunchKernel", 2), ("cuStreamSynchronize", 2),
                    ("cuMemcpyHtoDAsync", 0), ("cuMemcpyHtoDAsync", 2), ("cuNoSuchThing", 0)):
    p, st = vp(), ctypes.c_int(-1)
    rc = gpa(name.encode(), ctypes.byref(p), 13000, flags, ctypes.byref(st))
    ptrs[f"{name}/{flags}"] = [rc, st.value, p.value or 0]
exports = {n: ctypes.cast(getattr(drv, n), vp).value for n in
           ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuStreamSynchronize_ptsz", "cuMemcpyHtoDAsync_v2",
            "cuMemcpyHtoDAsync_v2_ptsz")}
rt.cudaDeviceSynchronize()
buf = (ctypes.c_uint64 * 64)()
n = rt.fakecuda_stats(buf, ctypes.sizeof(buf)) // 8
rs = list(buf[:n])
drv.fakecuda_stats.argtypes = [vp, ctypes.c_size_t]
drv.fakecuda_stats(buf, ctypes.sizeof(buf))
ds = list(buf[:n])
bs = (ctypes.c_ulonglong * 6)(); blas.fakeblas_stats(bs, 6)
ts = (ctypes.c_ulonglong * 4)(); tri.faketriton_stats(ts, 4)
print(json.dumps({"rt": rs, "drv": ds, "blas": list(bs), "tri": list(ts), "ptrs": ptrs, "exports": exports, "N": N}))
'''


def dynamic(mode):
    import json
    env = dict(os.environ)
    env.pop("FAKECUDA_DRIVER", None)
    if mode == "internal":
        env["FAKECUDA_PROCADDR"] = "internal"
    else:
        env.pop("FAKECUDA_PROCADDR", None)
    r = subprocess.run([sys.executable, "-c", CHILD, BUILD], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        fail(f"[{mode}] child failed: {r.stderr[-2000:]}")
        return
    o = json.loads(r.stdout.strip().splitlines()[-1])
    rt = dict(zip(FIELDS, o["rt"]))
    drv = dict(zip(FIELDS, o["drv"]))
    N = o["N"]
    rt_own = 5 * N                      # cudaLaunchKernel, __cudaLaunchKernel, ExC, Cooperative, GraphLaunch
    blas_own, tri_own = o["blas"][0], o["tri"][0]
    if blas_own != 2 * N or tri_own != 2 * N:
        fail(f"[{mode}] layer counts blas {blas_own} triton {tri_own}, want {2 * N} each")
    if drv["launches_driver"] != rt_own + blas_own + tri_own:
        fail(f"[{mode}] driver launches {drv['launches_driver']} != runtime {rt_own} + library {blas_own} + direct {tri_own}")
    for k, want in (("launches_runtime", rt_own), ("launches_library", blas_own), ("launches_direct", tri_own)):
        if drv[k] != want or rt[k] != want:
            fail(f"[{mode}] {k}: driver {drv[k]} runtime view {rt[k]} want {want}")
    if rt["launch_kernel"] != 2 * N or rt["launch_kernel_ex"] != N or rt["coop_launch"] != N or rt["graph_launch"] != N:
        fail(f"[{mode}] runtime view API counts {rt}")
    # driver view: cuLaunchKernel from runtime + vendor gemm + triton static; Ex from runtime + conv + triton
    if drv["launch_kernel"] != 4 * N or drv["launch_kernel_ex"] != 3 * N or drv["coop_launch"] != N:
        fail(f"[{mode}] driver API counts lk {drv['launch_kernel']} ex {drv['launch_kernel_ex']} coop {drv['coop_launch']}")
    want_ns = rt_own * 1000 + 4 * N * 2000
    if drv["kernel_ns_enqueued"] != want_ns or drv["kernel_ns_executed"] != want_ns:
        fail(f"[{mode}] kernel ns {drv['kernel_ns_enqueued']}/{drv['kernel_ns_executed']} != {want_ns}")
    p, ex = o["ptrs"], o["exports"]
    internal = mode == "internal"
    for key, exp in (("cuLaunchKernel/0", "cuLaunchKernel"), ("cuLaunchKernel/2", "cuLaunchKernel_ptsz"),
                     ("cuStreamSynchronize/2", "cuStreamSynchronize_ptsz"),
                     ("cuMemcpyHtoDAsync/0", "cuMemcpyHtoDAsync_v2"),
                     ("cuMemcpyHtoDAsync/2", "cuMemcpyHtoDAsync_v2_ptsz")):
        rc, st, ptr = p[key]
        if rc != 0 or st != 0 or not ptr or (ptr == ex[exp]) == internal:
            fail(f"[{mode}] cuGetProcAddress {key}: rc {rc} status {st} ptr {ptr:#x} export {exp} {ex[exp]:#x}")
    if p["cuLaunchKernel/0"][2] == p["cuLaunchKernel/2"][2]:
        fail(f"[{mode}] the _ptsz pointer equals the default one")
    if p["cuNoSuchThing/0"][:2] != [500, 1]:
        fail(f"[{mode}] unknown name: {p['cuNoSuchThing/0']}")
    if (drv["procaddr_internal"] > 0) != internal:
        fail(f"[{mode}] procaddr_internal {drv['procaddr_internal']}")
    print(f"dynamic [{mode}]: driver launches {drv['launches_driver']} = runtime {rt_own} + library "
          f"{blas_own} + direct {tri_own}; procaddr {drv['procaddr_calls']} calls, {drv['procaddr_internal']} internal")


static_checks()
real_names()
dynamic("default")
dynamic("internal")
print("selfcheck:", "FAILED" if fails else "OK")
sys.exit(1 if fails else 0)
