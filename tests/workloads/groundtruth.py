"""Shared runner of the ground-truth scenarios (fake torch + stand-in CUDA runtime).

Usage: python tests/workloads/<scenario>.py [--ready FILE] [--truth FILE] [--steps N] [--stop-on-sigterm]
  prints {"pid": ..., ...} as its first stdout line, waits for --ready FILE to exist (polls every
  10 ms) before the training loop, runs exactly N steps, writes the truth JSON (format
  "traceml-truth/1", see tests/README.md) to --truth FILE and prints a one-line summary.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAKETORCH = os.path.join(os.path.dirname(HERE), "faketorch")
if os.environ.get("FAKETORCH", "1") != "0" and FAKETORCH not in sys.path:
    sys.path.insert(0, FAKETORCH)

PHASES = ("input_wait", "h2d", "forward", "backward", "optimizer", "gpu_wait", "residual")
MS = 1_000_000
BANNER = None  # printed after the pid line (demo)

# Every knob of a scenario; durations in ns.
DEFAULTS = dict(
    steps=60,
    batch_size=2,
    num_workers=0,
    getitem_ns=1 * MS,          # sleep in Dataset.__getitem__ (per item)
    getitem_cpu_ns=0,           # CPU burnt in decode_sample() per item (thread CPU time)
    item_bytes=4096,            # bytes of one item's input tensor (H2D bytes/step = batch*item)
    pinned=False,               # pin_memory=True in the DataLoader
    non_blocking=True,          # x.to('cuda', non_blocking=...)
    bandwidth=10_000_000_000,   # simulated copy bandwidth, bytes/s
    layers=2,                   # Linear layers (each followed by ReLU except the last)
    layer_cpu_ns=300_000,       # host work per Linear forward
    layer_launches=2,           # kernels per Linear forward
    kernel_ns=50_000,           # duration of every kernel
    bwd_cpu_ns=400_000,         # host work per Linear in backward
    bwd_launches=4,             # kernels per Linear in backward
    opt_cpu_ns=500_000,         # host work in SGD.step
    opt_launches=3,
    sync_per_step=True,         # loss.item() each step (D2H cudaMemcpyAsync + cudaStreamSynchronize)
    cpu_every=0,                # out.cpu() every N steps (D2H copy + sync: waits for the backlog)
    item_rebuild_ns=0,          # CPU the training process burns unpickling each item (a Record
                                # whose pickle names rebuild_record): the workers' hand-over
    record_bytes=65536,         # bytes of a Record's payload (with item_rebuild_ns)
    fifo_every_ns=0,            # a named pipe fed one 4 KiB chunk every N ns by a thread of the
                                # training process; each __getitem__ reads one chunk from it
    residual_sleep_ns=0,        # time.sleep between steps (outside every phase)
    log_every=0,                # print a log line every N steps (residual)
    launch_path="runtime",      # where kernels go: runtime (cudaLaunchKernel -> cuLaunchKernel),
                                # vendor (every model/backward/optimizer kernel through the vendor
                                # library libfakeblasLt: its own cuGetProcAddress'd cuLaunchKernel),
                                # triton (through the Triton launcher: dlsym'd cuLaunchKernelEx),
                                # mixed (Linear forwards via the vendor GEMM, one torch.compile'd
                                # elementwise module via Triton, the rest via the runtime)
    grow_bytes=0,               # device memory allocated and kept each step (a leak: the GPU
                                # memory of the process grows; truth: device_reserved_bytes)
    verdict="balanced",         # what the daemon's verdict must be
)


def schedstat():
    """This thread's (ns on a CPU, ns runnable waiting for one), from the kernel."""
    with open("/proc/thread-self/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run), int(wait)


def line_of(statement):
    """The line of `statement` (a whole line, stripped) in this file: where the loop waits for
    the device, the line a profiler must name."""
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.strip() == statement)


WAITS = {"item": "loss.item()", "cpu": "host_out = out.cpu()"}


def decode_sample(ns):
    """Burns `ns` of this thread's CPU time: stands for decoding and augmentation."""
    end = time.thread_time_ns() + ns
    x = 0
    while time.thread_time_ns() < end:
        x += 1
    return x


# The named pipe the workers read (fifo_every_ns): each worker's descriptor, by pid, and the
# size of one chunk (at most PIPE_BUF: written whole).
FIFO_FDS = {}
FIFO_CHUNK = 4096


def start_other_children():
    """Children that are not workers, as a real job has them (`torch.compile` runs g++ and starts a
    Python compile-worker pool with its own command line): a `tail` and a `python -c`, alive
    through the loop. The daemon's worker count must leave them out (truth: worker_pids). Each
    ends by itself within a second of this process (a SIGKILLed target leaves no orphan)."""
    import atexit
    import subprocess
    me = os.getpid()
    kids = [subprocess.Popen(["tail", "-f", "/dev/null", "--pid=%d" % me]),
            subprocess.Popen([sys.executable, "-c",
                              "import os, time\nwhile os.getppid() == %d: time.sleep(0.5)" % me])]

    def stop():
        for k in kids:
            k.kill()
            k.wait()
    atexit.register(stop)
    return kids, stop


def start_fifo(cfg):
    """Makes the named pipe and the thread that feeds it: one chunk every fifo_every_ns. The
    pipe is held open for reading and writing here, so the workers' opens never block."""
    import atexit
    import shutil
    import tempfile
    import threading
    d = tempfile.mkdtemp(prefix="traceml-fifo-")
    atexit.register(shutil.rmtree, d, True)
    path = os.path.join(d, "samples.fifo")
    os.mkfifo(path)
    cfg["fifo_path"] = path
    fd = os.open(path, os.O_RDWR)

    def feed():
        chunk = bytes(FIFO_CHUNK)
        while True:
            time.sleep(cfg["fifo_every_ns"] / 1e9)
            os.write(fd, chunk)

    return threading.Thread(target=feed, name="fifo-feeder", daemon=True)


# ns the training process spent in rebuild_record (unpickling the workers' Records): the truth of
# the hand-over.
REBUILT_NS = [0]


def rebuild_record(payload, ns):
    """Unpickles a Record, burning `ns` of this thread's CPU: what an item costs the process that
    receives it (a Python object rebuilt on arrival, as a tensor's storage is by
    torch.multiprocessing.reductions). Runs in the training process, inside next(it)."""
    t0 = time.monotonic_ns()
    end = time.thread_time_ns() + ns
    x = 0
    while time.thread_time_ns() < end:
        x += 1
    REBUILT_NS[0] += time.monotonic_ns() - t0
    return Record(payload, ns)


class Record:
    """An item's annotations: pickles as rebuild_record(payload, ns)."""

    def __init__(self, payload, ns):
        self.payload, self.ns = payload, ns

    def __reduce__(self):
        return rebuild_record, (self.payload, self.ns)


def make_dataset(cfg):
    import torch
    from torch.utils.data import Dataset

    class SlowDataset(Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            t0, (c0, q0) = time.perf_counter_ns(), schedstat()
            read_ns = 0
            if cfg["fifo_every_ns"]:
                fd = FIFO_FDS.get(os.getpid())
                if fd is None:
                    fd = FIFO_FDS[os.getpid()] = os.open(cfg["fifo_path"], os.O_RDONLY)
                r0 = time.perf_counter_ns()
                os.read(fd, FIFO_CHUNK)
                read_ns = time.perf_counter_ns() - r0
            if cfg["getitem_ns"]:
                time.sleep(cfg["getitem_ns"] / 1e9)
            if cfg["getitem_cpu_ns"]:
                decode_sample(cfg["getitem_cpu_ns"])
            log = cfg.get("items_log")
            if log:
                # One line per item, appended (O_APPEND: whole lines from every worker): the
                # item's wall time, time on a CPU and time runnable waiting for one, in the
                # process that made it (the kernel's schedstat): the truth of how much of a
                # worker's busy time it was not asleep.
                c1, q1 = schedstat()
                with open(log, "a") as f:
                    f.write(f"{os.getpid()} {time.perf_counter_ns() - t0} {c1 - c0} {q1 - q0} "
                            f"{read_ns}\n")
            if cfg["item_rebuild_ns"]:
                return (torch.empty(cfg["item_bytes"] // 4), torch.empty(1),
                        Record(bytes(cfg["record_bytes"]), cfg["item_rebuild_ns"]))
            return torch.empty(cfg["item_bytes"] // 4), torch.empty(1)

    return SlowDataset(cfg["steps"] * cfg["batch_size"])


def make_model(cfg):
    import torch
    import torch.nn as nn
    mixed = cfg["launch_path"] == "mixed"
    mods = []
    for i in range(cfg["layers"]):
        mods.append(nn.Linear(64, 64, cpu_ns=cfg["layer_cpu_ns"], launches=cfg["layer_launches"],
                              kernel_ns=cfg["kernel_ns"], bwd_cpu_ns=cfg["bwd_cpu_ns"],
                              bwd_launches=cfg["bwd_launches"], path="vendor" if mixed else None))
        if i + 1 < cfg["layers"]:
            mods.append(nn.ReLU(kernel_ns=cfg["kernel_ns"]))
    if mixed:  # a compiled elementwise op: its kernel goes through the Triton launcher
        mods.append(torch.compile(nn.ReLU(kernel_ns=cfg["kernel_ns"])))
    return nn.Sequential(*mods)


def wait_ready(path):
    if not path:
        return
    while not os.path.exists(path):
        time.sleep(0.01)


def parse(name, cfg):
    ap = argparse.ArgumentParser(description=f"ground-truth scenario {name}")
    ap.add_argument("--ready", help="wait until this file exists before training")
    ap.add_argument("--truth", help="write the truth JSON here")
    ap.add_argument("--steps", type=int, default=cfg["steps"])
    ap.add_argument("--stop-on-sigterm", action="store_true",
                    help="SIGTERM ends the loop after the current step; the truth of the steps "
                         "done is written as at the loop's end")
    return ap.parse_args()


def thread_switches():
    """This thread's context switches so far (voluntary + involuntary), from its /proc status;
    None where /proc does not say."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
            n = [int(line.split()[1]) for line in f if "ctxt_switches:" in line]
        return sum(n) if len(n) == 2 else None
    except OSError:
        return None


def run(name, overrides, argv_args=None):
    cfg = dict(DEFAULTS)
    cfg.update(overrides)
    a = argv_args or parse(name, cfg)
    cfg["steps"] = a.steps
    if a.truth and "{rank}" in a.truth:
        # One truth file per rank of a job (torchrun gives every rank the same arguments).
        a.truth = a.truth.replace("{rank}", os.environ.get("RANK", "0"))
    if a.truth:
        cfg["items_log"] = a.truth + ".items"
    import torch
    if cfg["launch_path"] not in ("runtime", "vendor", "triton", "mixed"):
        raise SystemExit(f"launch_path {cfg['launch_path']!r}: runtime, vendor, triton or mixed")
    if cfg["launch_path"] in ("vendor", "triton"):
        torch.set_launch_path(cfg["launch_path"])
    if cfg["launch_path"] == "mixed":
        # Loaded (and the vendor library's own runtime initialised) before --ready, as in a job
        # the daemon attaches to while it runs: cuBLAS and Triton's launcher are mapped then.
        torch._C.blas().fakeblas_init()
        torch._C.triton()
    if "LOCAL_RANK" in os.environ:
        # A rank of a job uses the device of its local rank (as DDP scripts do).
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_bandwidth(cfg["bandwidth"])
    model = make_model(cfg).cuda()
    kept = []  # grow_bytes' leak
    lossf = torch.nn.MSELoss(kernel_ns=cfg["kernel_ns"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, cpu_ns=cfg["opt_cpu_ns"],
                          launches=cfg["opt_launches"], kernel_ns=cfg["kernel_ns"])
    feeder = start_fifo(cfg) if cfg["fifo_every_ns"] else None
    loader = torch.utils.data.DataLoader(make_dataset(cfg), batch_size=cfg["batch_size"],
                                         num_workers=cfg["num_workers"], pin_memory=cfg["pinned"])
    # The start line goes out once torch is imported and its libraries are loaded: the harness
    # attaches then, to a process that has started, as a user attaches to a running job.
    print(json.dumps({"pid": os.getpid(), "scenario": name, "python": sys.version.split()[0],
                      "executable": sys.executable}), flush=True)
    if BANNER:
        print(BANNER, flush=True)
    wait_ready(a.ready)
    others, stop_others = start_other_children()

    now = time.monotonic_ns  # CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns
    stats = torch.cuda.stats
    nb = cfg["non_blocking"]
    raw = []
    waits = {k: 0 for k in WAITS}  # ns the loop spent in each wait
    it = iter(loader)  # workers (if any) start here, after --ready
    if feeder:
        feeder.start()
    stop = []
    if getattr(a, "stop_on_sigterm", False):
        import signal
        signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    # The cyclic GC could run at any allocation, inside a measured phase; run it only in the
    # measured cleanup at the end of each step instead.
    import gc
    gc.collect()
    gc.disable()
    s_prev = stats()
    s_prev["device_reserved_bytes"] = torch.cuda.memory_reserved()
    rebuilt = []  # REBUILT_NS after each step's next(it)
    rebuilt_start = REBUILT_NS[0]
    switches_start = thread_switches()
    loop_start = now()
    step = 0
    while True:
        t0 = now()
        if stop:
            t_stop = t0
            t_stop_start = t0
            break
        try:
            batch = next(it)
        except StopIteration:
            t_stop = now()
            t_stop_start = t0  # the last step ends where the final (StopIteration) next() begins
            break
        t1 = now()
        rebuilt.append(REBUILT_NS[0])
        xd = batch[0].to("cuda", non_blocking=nb)
        yd = batch[1].to("cuda", non_blocking=nb)
        t2 = now()
        out = model(xd)
        t3 = now()
        loss = lossf(out, yd)
        t4 = now()
        opt.zero_grad()
        t5 = now()
        loss.backward()
        t6 = now()
        opt.step()
        if cfg["grow_bytes"]:
            leak = torch.empty(cfg["grow_bytes"], device="cuda", nbytes=cfg["grow_bytes"])
            leak._ensure_buffer()
            kept.append(leak)
        t7 = now()
        if cfg["sync_per_step"]:
            w0 = now()
            loss.item()
            waits["item"] += now() - w0
        if cfg["cpu_every"] and step % cfg["cpu_every"] == cfg["cpu_every"] - 1:
            w0 = now()
            host_out = out.cpu()
            waits["cpu"] += now() - w0
            del host_out
        t8 = now()
        if cfg["log_every"] and step % cfg["log_every"] == 0:
            print(f"step {step} loss 0.5", flush=True)
        if cfg["residual_sleep_ns"]:
            time.sleep(cfg["residual_sleep_ns"] / 1e9)
        t9 = now()
        # Free this step's tensors and read the runtime's counters here, inside the residual and
        # measured (cleanup_ns), so that no deallocation lands inside a phase of the next step.
        del batch, xd, yd, out, loss
        gc.collect(0)
        s = stats()
        s["device_reserved_bytes"] = torch.cuda.memory_reserved()
        t10 = now()
        raw.append((t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, s_prev, s))
        s_prev = s
        step += 1
    loop_end = now()
    switches_end = thread_switches()
    stop_others()
    gc.enable()

    steps = []
    for i, (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, sa, sb) in enumerate(raw):
        t_end = raw[i + 1][0] if i + 1 < len(raw) else t_stop_start
        d = {k: sb[k] - sa[k] for k in sb}
        ph = {
            "input_wait": t1 - t0,
            "h2d": t2 - t1,
            "forward": (t3 - t2) + (t4 - t3),
            "backward": t6 - t5,
            "optimizer": t7 - t6,
            "gpu_wait": t8 - t7,
        }
        ph["residual"] = (t_end - t0) - sum(ph.values())
        steps.append({
            "index": i,
            "t_start_ns": t0,
            "t_end_ns": t_end,
            "wall_ns": t_end - t0,
            "phases_ns": ph,
            "marks_ns": {"next_end": t1, "h2d_end": t2, "model_end": t3, "loss_end": t4,
                         "zero_grad_end": t5, "backward_end": t6, "step_end": t7, "sync_end": t8,
                         "sleep_end": t9, "cleanup_end": t10},
            "model_ns": t3 - t2,
            "loss_fn_ns": t4 - t3,
            "zero_grad_ns": t5 - t4,
            "residual_sleep_ns": t9 - t8,
            "cleanup_ns": t10 - t9,
            "unaccounted_ns": ph["residual"] - (t5 - t4) - (t9 - t8) - (t10 - t9),
            # Of the input wait: unpickling the workers' Records (rebuild_record).
            "handover_ns": rebuilt[i] - (rebuilt[i - 1] if i else rebuilt_start),
            "bytes_h2d": d["bytes_h2d"],
            "bytes_d2h": d["bytes_d2h"],
            "copies_h2d": d["copies_h2d"],
            "copies_d2h": d["copies_d2h"],
            # kernel launches by every path (the runtime's include graph launches); the calling
            # layers' own counts, which the stand-in driver's launches_driver equals
            "launches": d["launches_runtime"] + d["launches_library"] + d["launches_direct"],
            "launches_by_path": {"runtime": d["launches_runtime"], "library": d["launches_library"],
                                 "direct": d["launches_direct"]},
            "kernel_ns": d["kernel_ns_enqueued"],
            # simulated kernel time the device finished in this step (its busy time: what
            # NVML's utilization measures), and the device memory the process holds at its end
            "device_busy_ns": d["kernel_ns_executed"],
            "device_reserved_bytes": sb["device_reserved_bytes"],
            "syncs": d["stream_sync"] + d["device_sync"] + d["event_sync"],
            "memcpy_async_calls": d["memcpy_async_calls"],
        })

    med = {p: int(statistics.median(s["phases_ns"][p] for s in steps)) for p in PHASES} if steps else {}
    dominant = max(med, key=med.get) if med else None
    truth = {
        "format": "traceml-truth/1",
        "scenario": name,
        "backend": "faketorch+fakecuda",
        "python": sys.version.split()[0],
        "pid": os.getpid(),
        "tid": threading.get_native_id(),
        "clock": "CLOCK_MONOTONIC",
        "config": cfg,
        "expected_verdict": cfg["verdict"],
        "dominant_phase": dominant,
        "loop_start_ns": loop_start,
        "loop_end_ns": loop_end,
        "final_next": {"t_start_ns": t_stop_start, "t_end_ns": t_stop},
        # The training thread's context switches (voluntary + involuntary, its /proc status)
        # from the loop's start to its end: each is one switch out and one back in.
        "thread_switches": None if switches_start is None or switches_end is None
        else switches_end - switches_start,
        "step_count": len(steps),
        "steps": steps,
        "median_phases_ns": med,
        "totals": {
            "wall_ns": sum(s["wall_ns"] for s in steps),
            **{f"{p}_ns": sum(s["phases_ns"][p] for s in steps) for p in PHASES},
            **{k: sum(s[k] for s in steps) for k in ("bytes_h2d", "bytes_d2h", "launches", "kernel_ns",
                                                     "syncs", "copies_h2d", "copies_d2h")},
        },
        "record_function": {
            "enumerate(DataLoader)#%s.__next__" % type(it).__name__: len(steps) + 1,
            "Optimizer.step#SGD.step": len(steps),
            "Optimizer.zero_grad#SGD.zero_grad": len(steps),
        },
        "backward_calls": len(steps),
        # Where the loop waited for the device: each wait's line in this file and its time.
        "waits": [{"name": k, "file": os.path.abspath(__file__), "line": line_of(WAITS[k]),
                   "statement": WAITS[k], "ns": ns} for k, ns in waits.items() if ns],
        "worker_pids": [w.pid for w in getattr(it, "_workers", [])],
        "other_children": [k.pid for k in others],
        "cuda_stats": stats(),
    }
    if a.truth:
        tmp = a.truth + ".tmp"
        with open(tmp, "w") as f:
            json.dump(truth, f, indent=1)
        os.replace(tmp, a.truth)
    print(json.dumps({"done": name, "steps": len(steps), "wall_s": round((loop_end - loop_start) / 1e9, 3),
                      "median_ms": {p: round(v / 1e6, 2) for p, v in med.items()}, "dominant": dominant}),
          flush=True)
    return truth
