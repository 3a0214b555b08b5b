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
4. Stand-in NVML (libnvidia-ml.so.1): SONAME, no libcuda link, exports the versioned names nvml.h
   declares (nm -D; each also declared in the nvml.h it was built against, when that is found);
   then, with FAKECUDA_DEVICES=2 and a temporary FAKECUDA_NVML_DIR, a child with
   CUDA_VISIBLE_DEVICES=1 (cudaSetDevice(0) -> physical 1) holding known cudaMalloc bytes and
   busy with kernels for 250 ms of a ~500 ms window, read through NVML in this process: device
   count, the process on the right device, exact memory, device and process utilization against
   the truth, the size protocols, every failure switch, and the record gone after a normal exit
   and ignored (then removed) after SIGKILL.
5. Pace: 5,000 kernels of 2 us (10 ms of simulated device time) launched back to back reach
   cudaDeviceSynchronize within 150 ms, with exactly 10 ms executed (a device that slept once per
   operation took ~550 ms here: the timer's floor, not the simulated time); one 20 ms kernel
   ends no sooner than its 20 ms.
Exit status 1 on any failure."""
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

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


# ---------------------------------------------------------------- stand-in NVML ----------------

# The names the stand-in must export, as nvml.h declares them (versioned where the header is).
NVML_NAMES = [
    "nvmlInit_v2", "nvmlInit", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
    "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetIndex",
    "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrentClocksEventReasons",
]
NVML_SUCCESS, NVML_ERROR_UNINITIALIZED, NVML_ERROR_NOT_SUPPORTED = 0, 1, 3
NVML_ERROR_NOT_FOUND, NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_GPU_IS_LOST = 6, 7, 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
GIB = 1 << 30


def nvml_header():
    d = os.environ.get("NVML_INCLUDE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "traceml", "nvml-dev")
    p = os.path.join(d, "nvml.h")
    return p if os.path.exists(p) else None


def nvml_static():
    lib = os.path.join(BUILD, "libnvidia-ml.so.1")
    dyn = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout
    if "Library soname: [libnvidia-ml.so.1]" not in dyn:
        fail("libnvidia-ml.so.1: SONAME is not libnvidia-ml.so.1")
    if re.search(r"NEEDED.*\[libcuda(rt)?\.so", dyn):
        fail("libnvidia-ml.so.1: DT_NEEDED on libcuda/libcudart")
    if os.readlink(os.path.join(BUILD, "libnvidia-ml.so")) != "libnvidia-ml.so.1":
        fail("libnvidia-ml.so does not point at libnvidia-ml.so.1")
    exported = {ln.split()[-1] for ln in subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True,
                                                         text=True).stdout.splitlines() if " T " in ln}
    missing = [n for n in NVML_NAMES if n not in exported]
    if missing:
        fail(f"libnvidia-ml.so.1 does not export {missing}")
    hdr = nvml_header()
    if hdr:
        text = open(hdr, errors="replace").read()
        undeclared = [n for n in sorted(exported) if n.startswith("nvml") and
                      not re.search(r"DECLDIR[\s\w*]*\b" + re.escape(n) + r"\s*\(", text)]
        if undeclared:
            fail(f"libnvidia-ml.so.1 exports names {os.path.basename(hdr)} does not declare: {undeclared}")
        extra = sorted(n for n in exported if not n.startswith("nvml"))
        if extra:
            fail(f"libnvidia-ml.so.1 exports non-NVML names {extra}")
    print(f"nvml static: {len(exported)} exports, the {len(NVML_NAMES)} expected names present"
          + (f", each declared in {hdr}" if hdr else " (nvml.h not found: declarations not checked)"))


NVML_CHILD = r'''
import ctypes, os, sys, time
rt = ctypes.CDLL(os.path.join(sys.argv[1], "libcudart.so.12"))
vp = ctypes.c_void_p
class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
rt.cudaLaunchKernel.argtypes = [vp, dim3, dim3, vp, ctypes.c_size_t, vp]
rt.fakecuda_set_kernel_ns.argtypes = [ctypes.c_uint64]
rt.cudaMalloc.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t]
rt.cudaFree.argtypes = [vp]
n, d = ctypes.c_int(-1), ctypes.c_int(-1)
rc = [rt.cudaGetDeviceCount(ctypes.byref(n)), rt.cudaSetDevice(1), rt.cudaSetDevice(0), rt.cudaGetDevice(ctypes.byref(d))]
ptrs = []
for size in (1000003, 4096, 777):
    p = vp()
    assert rt.cudaMalloc(ctypes.byref(p), size) == 0
    ptrs.append(p)
assert rt.cudaFree(ptrs[1]) == 0
print("ready", os.getpid(), n.value, d.value, *rc, flush=True)
if sys.stdin.readline().strip() == "go":
    rt.fakecuda_set_kernel_ns(50_000_000)
    for _ in range(5):  # 250 ms of kernels, back to back on the device timeline
        assert rt.cudaLaunchKernel(vp(0x1234), dim3(1, 1, 1), dim3(32, 1, 1), None, 0, None) == 0
    assert rt.cudaDeviceSynchronize() == 0
    print("done", time.monotonic_ns(), flush=True)
    sys.stdin.readline()
'''


class NvmlUtil(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class NvmlMem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlMemV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlProc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


class NvmlProcUtil(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


class NvmlPci(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


def nvml_dynamic(nvdir):
    nv = ctypes.CDLL(os.path.join(BUILD, "libnvidia-ml.so.1"))
    nv.nvmlErrorString.restype = ctypes.c_char_p
    nv.nvmlDeviceGetProcessUtilization.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint),
                                                   ctypes.c_ulonglong]
    by = ctypes.byref
    switches = ("FAKENVML_SLOW_MS", "FAKENVML_LOST_AFTER_MS", "FAKENVML_INIT", "FAKENVML_PROCESS_UTIL")
    for k in switches:
        os.environ.pop(k, None)
    os.environ.update(FAKECUDA_NVML_DIR=nvdir, FAKECUDA_DEVICES="2")

    def init(**switch):
        for k in switches:
            os.environ.pop(k, None)
        os.environ.update(switch)
        return nv.nvmlInit_v2()

    def handle(i):
        h = ctypes.c_void_p()
        rc = nv.nvmlDeviceGetHandleByIndex_v2(i, by(h))
        return h if rc == 0 else rc

    def procs(h):
        cnt = ctypes.c_uint(0)
        rc = nv.nvmlDeviceGetComputeRunningProcesses_v3(h, by(cnt), None)
        if rc == NVML_SUCCESS:
            return []
        if rc != NVML_ERROR_INSUFFICIENT_SIZE:
            return rc
        arr = (NvmlProc * cnt.value)()
        rc = nv.nvmlDeviceGetComputeRunningProcesses_v3(h, by(cnt), arr)
        return [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in arr[:cnt.value]] if rc == 0 else rc

    def used(h):
        m = NvmlMem()
        rc = nv.nvmlDeviceGetMemoryInfo(h, by(m))
        return m.used if rc == 0 else ("rc", rc)

    def start_child():
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="1")
        env.pop("FAKECUDA_DRIVER", None)
        c = subprocess.Popen([sys.executable, "-c", NVML_CHILD, BUILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
        line = c.stdout.readline().split()
        if not line or line[0] != "ready":
            fail(f"nvml: child did not start: {line}")
            c.kill()
            return c, None
        return c, [int(x) for x in line[1:]]

    # -- before init, and an init that fails
    cnt = ctypes.c_uint(0)
    if nv.nvmlDeviceGetCount_v2(by(cnt)) != NVML_ERROR_UNINITIALIZED:
        fail("nvml: a call before nvmlInit did not return NVML_ERROR_UNINITIALIZED")
    rc = init(FAKENVML_INIT="mismatch"), nv.nvmlInitWithFlags(0), nv.nvmlDeviceGetCount_v2(by(cnt))
    if rc != (NVML_ERROR_LIB_RM_VERSION_MISMATCH, NVML_ERROR_LIB_RM_VERSION_MISMATCH, NVML_ERROR_UNINITIALIZED):
        fail(f"nvml: FAKENVML_INIT=mismatch: init/initWithFlags/count {rc}")
    if init() != 0 or nv.nvmlDeviceGetCount_v2(by(cnt)) != 0 or cnt.value != 2:
        fail(f"nvml: FAKECUDA_DEVICES=2: count {cnt.value}")
        return
    h0, h1 = handle(0), handle(1)
    if handle(2) != 2:
        fail("nvml: handle of index 2 with 2 devices is not NVML_ERROR_INVALID_ARGUMENT")

    # -- a process on physical device 1 (CUDA_VISIBLE_DEVICES=1, ordinal 0)
    c, info = start_child()
    if not info:
        return
    pid, vis_count, cur_dev, rc_count, rc_set1, rc_set0, rc_get = info
    if (vis_count, cur_dev, rc_count, rc_set1, rc_set0, rc_get) != (1, 0, 0, 101, 0, 0):
        fail(f"nvml: child saw count {vis_count} device {cur_dev}, rc count/set(1)/set(0)/get "
             f"{rc_count}/{rc_set1}/{rc_set0}/{rc_get}; want 1 0, 0/101/0/0")
    want_mem = 1000003 + 777
    if procs(h1) != [(pid, want_mem, 0xFFFFFFFF, 0xFFFFFFFF)] or procs(h0) != []:
        fail(f"nvml: processes: device 1 {procs(h1)} device 0 {procs(h0)}; want pid {pid} with {want_mem} on device 1 only")
    m2 = NvmlMemV2(version=ctypes.sizeof(NvmlMemV2) | (2 << 24))
    rc2 = nv.nvmlDeviceGetMemoryInfo_v2(h1, by(m2))
    if used(h1) != want_mem or used(h0) != 0 or rc2 != 0 or (m2.used, m2.reserved, m2.total, m2.free) != (
            want_mem, 0, 80 * GIB, 80 * GIB - want_mem):
        fail(f"nvml: memory used device 1 {used(h1)} (v2 rc {rc2}: {m2.used}/{m2.reserved}/{m2.total}/{m2.free}) "
             f"device 0 {used(h0)}; want exactly {want_mem} and 0")
    if nv.nvmlDeviceGetMemoryInfo_v2(h1, by(NvmlMemV2(version=1))) != 25:
        fail("nvml: nvmlDeviceGetMemoryInfo_v2 with a wrong struct version did not return 25")
    names = []
    for h in (h0, h1):
        name, uuid, pci, idx = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96), NvmlPci(), ctypes.c_uint()
        rc = (nv.nvmlDeviceGetName(h, name, 96), nv.nvmlDeviceGetUUID(h, uuid, 96), nv.nvmlDeviceGetPciInfo_v3(h, by(pci)),
              nv.nvmlDeviceGetIndex(h, by(idx)))
        names.append((rc, name.value, uuid.value, pci.busId, idx.value))
    if any(n[0] != (0, 0, 0, 0) for n in names) or names[0][1] != b"TraceML stand-in GPU" or \
            names[0][2] == names[1][2] or not names[1][2].startswith(b"GPU-") or names[1][4] != 1 or \
            names[0][3] == names[1][3]:
        fail(f"nvml: name/uuid/pci/index {names}")
    if nv.nvmlDeviceGetName(h0, ctypes.create_string_buffer(4), 4) != NVML_ERROR_INSUFFICIENT_SIZE:
        fail("nvml: nvmlDeviceGetName into 4 bytes is not NVML_ERROR_INSUFFICIENT_SIZE")

    # -- utilization: kernels for 250 ms of a ~500 ms window
    u = NvmlUtil()
    nv.nvmlDeviceGetUtilizationRates(h1, by(u))
    nv.nvmlDeviceGetUtilizationRates(h0, by(u))
    t0, ts0 = time.monotonic_ns(), time.time_ns() // 1000
    c.stdin.write("go\n")
    c.stdin.flush()
    time.sleep(0.5)
    u1, u0 = NvmlUtil(), NvmlUtil()
    rc = nv.nvmlDeviceGetUtilizationRates(h1, by(u1)), nv.nvmlDeviceGetUtilizationRates(h0, by(u0))
    t1 = time.monotonic_ns()
    pcnt = ctypes.c_uint(0)
    prc1 = nv.nvmlDeviceGetProcessUtilization(h1, None, by(pcnt), ts0)
    samples = (NvmlProcUtil * max(pcnt.value, 1))()
    prc2 = nv.nvmlDeviceGetProcessUtilization(h1, samples, by(pcnt), ts0)
    temp, power, limit = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
    rc_tp = (nv.nvmlDeviceGetTemperature(h1, 0, by(temp)), nv.nvmlDeviceGetPowerUsage(h1, by(power)),
             nv.nvmlDeviceGetEnforcedPowerLimit(h1, by(limit)))
    done = c.stdout.readline().split()
    end = int(done[1]) if len(done) == 2 else t1
    # truth: the 250 ms of kernels ran back to back ending at `end`; what of it fell in [t0, t1]
    truth = 100.0 * (250e6 - max(0, end - t1)) / (t1 - t0)
    if rc != (0, 0) or abs(u1.gpu - truth) > 10 or u0.gpu != 0:
        fail(f"nvml: utilization device 1 {u1.gpu} % (truth {truth:.1f} %), device 0 {u0.gpu} % (truth 0), rc {rc}")
    sm = samples[0].smUtil if prc2 == 0 and pcnt.value >= 1 else None
    now_us = time.time_ns() // 1000
    if prc1 != NVML_ERROR_INSUFFICIENT_SIZE or prc2 != 0 or pcnt.value != 1 or samples[0].pid != pid or \
            sm is None or abs(sm - truth) > 10 or not (ts0 < samples[0].timeStamp <= now_us):
        fail(f"nvml: process utilization: size call {prc1}, call {prc2}, count {pcnt.value}, "
             f"pid {samples[0].pid} (want {pid}), smUtil {sm} (truth {truth:.1f})")
    if rc_tp != (0, 0, 0) or not (40 <= temp.value <= 80) or not (100000 <= power.value <= 700000) or limit.value != 700000:
        fail(f"nvml: temperature {temp.value} power {power.value} limit {limit.value} rc {rc_tp}")
    print(f"nvml: device count 2; pid {pid} on physical 1 (CUDA_VISIBLE_DEVICES=1, ordinal 0) with {want_mem} B; "
          f"utilization {u1.gpu} % and process smUtil {sm} % against truth {truth:.1f} % "
          f"(250 ms of kernels in a {(t1 - t0) / 1e6:.0f} ms window); temperature {temp.value} C, power {power.value} mW")

    # -- normal exit: the record goes with it
    c.stdin.write("\n")
    c.stdin.flush()
    c.wait()
    if os.listdir(nvdir) or procs(h1) != [] or used(h1) != 0:
        fail(f"nvml: after a normal exit: files {os.listdir(nvdir)}, processes {procs(h1)}, memory {used(h1)}")

    # -- SIGKILL: the record stays behind; NVML ignores it (the zombie first) and removes it
    c, info = start_child()
    if info:
        if [p[0] for p in procs(h1)] != [info[0]]:
            fail(f"nvml: second child {info[0]} not listed: {procs(h1)}")
        os.kill(info[0], signal.SIGKILL)
        deadline = time.monotonic() + 2
        while procs(h1) != [] and time.monotonic() < deadline:
            time.sleep(0.01)
        zombie = procs(h1)
        c.wait()
        if zombie != [] or used(h1) != 0 or os.listdir(nvdir):
            fail(f"nvml: killed process: listed {zombie}, memory {used(h1)}, files left {os.listdir(nvdir)}")

    # -- failure switches (each read at the first nvmlInit)
    def reinit(**switch):
        while nv.nvmlShutdown() == 0:
            pass
        return init(**switch)

    reinit(FAKENVML_PROCESS_UTIL="unsupported")
    pcnt = ctypes.c_uint(0)
    if nv.nvmlDeviceGetProcessUtilization(handle(0), None, by(pcnt), 0) != NVML_ERROR_NOT_SUPPORTED:
        fail("nvml: FAKENVML_PROCESS_UTIL=unsupported did not give NVML_ERROR_NOT_SUPPORTED")
    reinit(FAKENVML_SLOW_MS="100")
    t = time.monotonic()
    slow_rc = used(handle(0))
    slow = time.monotonic() - t
    if slow_rc != 0 or slow < 0.19:  # the handle and the query: 100 ms each
        fail(f"nvml: FAKENVML_SLOW_MS=100: two device calls took {slow * 1000:.0f} ms (rc {slow_rc})")
    reinit(FAKENVML_LOST_AFTER_MS="150")
    h = handle(0)
    before = used(h)
    time.sleep(0.2)
    cnt = ctypes.c_uint(0)
    after = used(h), handle(0), nv.nvmlDeviceGetCount_v2(by(cnt)), nv.nvmlErrorString(NVML_ERROR_GPU_IS_LOST)
    if before != 0 or after != (("rc", NVML_ERROR_GPU_IS_LOST), NVML_ERROR_GPU_IS_LOST, 0, b"GPU is lost"):
        fail(f"nvml: FAKENVML_LOST_AFTER_MS=150: before {before}, after 200 ms {after}")
    while nv.nvmlShutdown() == 0:
        pass
    if nv.nvmlShutdown() != NVML_ERROR_UNINITIALIZED or nv.nvmlDeviceGetCount_v2(by(cnt)) != NVML_ERROR_UNINITIALIZED:
        fail("nvml: after the last nvmlShutdown calls did not return NVML_ERROR_UNINITIALIZED")
    for k in switches:
        os.environ.pop(k, None)
    print(f"nvml: switches checked (mismatch, process util unsupported, slow {slow * 1000:.0f} ms for 2 calls, "
          "lost after 150 ms); records: removed at exit, ignored and removed after SIGKILL")


PACE = r"""
import ctypes, json, os, sys, time
B = sys.argv[1]
rt = ctypes.CDLL(os.path.join(B, "libcudart.so.12"))
class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
vp = ctypes.c_void_p
rt.cudaLaunchKernel.argtypes = [vp, dim3, dim3, vp, ctypes.c_size_t, vp]
rt.fakecuda_set_kernel_ns.argtypes = [ctypes.c_uint64]
g, b = dim3(1, 1, 1), dim3(32, 1, 1)
out = {}
for name, n, ns in (("short", 5000, 2000), ("long", 1, 20_000_000)):
    rt.fakecuda_set_kernel_ns(ns)
    rt.cudaDeviceSynchronize()
    t0 = time.monotonic_ns()
    for _ in range(n):
        rt.cudaLaunchKernel(vp(0x1234), g, b, None, 0, None)
    rt.cudaDeviceSynchronize()
    out[name] = time.monotonic_ns() - t0
print(json.dumps(out))
"""


def pace():
    r = subprocess.run([sys.executable, "-c", PACE, BUILD], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        fail(f"pace: the child failed: {r.stderr[-400:]}")
        return
    import json
    t = json.loads(r.stdout.strip().splitlines()[-1])
    if t["short"] > 150_000_000:
        fail(f"pace: 5,000 kernels of 2 us took {t['short'] / 1e6:.1f} ms to sync (simulated 10 ms)")
    if t["long"] < 20_000_000:
        fail(f"pace: a 20 ms kernel ended after {t['long'] / 1e6:.1f} ms")
    print(f"pace: 5,000 x 2 us in {t['short'] / 1e6:.1f} ms, one 20 ms kernel in {t['long'] / 1e6:.1f} ms")


# Every child's driver writes its record here, not in the machine's default directory.
_nvdir = tempfile.mkdtemp(prefix="fakecuda-nvml-selfcheck-")
os.environ["FAKECUDA_NVML_DIR"] = _nvdir
try:
    static_checks()
    real_names()
    dynamic("default")
    dynamic("internal")
    pace()
    if os.listdir(_nvdir):
        fail(f"records left after the children exited: {os.listdir(_nvdir)}")
    nvml_static()
    nvml_dynamic(_nvdir)
finally:
    shutil.rmtree(_nvdir, ignore_errors=True)
print("selfcheck:", "FAILED" if fails else "OK")
sys.exit(1 if fails else 0)
