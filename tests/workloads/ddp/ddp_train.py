"""Multi-rank ground-truth workload: real PyTorch on CPU, gloo, started by torchrun.

    torchrun --nproc_per_node=N --master_port=P tests/workloads/ddp/ddp_train.py [options]

--mode ddp        a small MLP wrapped in DistributedDataParallel: DDP all-reduces the gradients
                  inside loss.backward() (C++ reducer, gloo); the wait is not visible to Python.
--mode allreduce  no DDP: after backward the script all-reduces the gradients itself with
                  synchronous dist.all_reduce(grad) calls (one per parameter, or one per step with
                  --flatten), timed from Python: that is the collective wait of the step.

Faults (all ranks get the same arguments; each rank decides from its own RANK):
--desync-rank R --desync-step K --desync-how op|skip   (allreduce mode)
                  in step K rank R calls dist.broadcast where the others all-reduce (op), or no
                  collective at all (skip); every rank then ends with a dist.barrier(). The truth
                  (written by every rank right before step K's collective) has "desync": the
                  step, the rank, how, and "seq": the collectives each rank issued in the measured
                  steps before it (the number, from 0, of the collective where they disagree).
--straggler-rank R --straggler-phase compute|input --straggler-ms X
                  rank R burns X ms of CPU (busy loop on CLOCK_MONOTONIC, so exactly X ms of wall
                  time whatever the CPU contention) per step: at the start of the model's forward
                  (compute) or in its Dataset.__getitem__ (input; one item is one batch).
                  --straggler-how sleep: time.sleep instead of the busy loop (no CPU taken from the
                  other ranks on a small machine; the time is still inside forward / __getitem__,
                  but the rank is off-CPU during it).
                  --straggler-from K --straggler-to K2: slow only in steps K..K2-1 (a transient
                  episode); --straggler-every N: rotating, the slow rank of step i is
                  (i // N) % world_size (--straggler-rank not needed).
--hang-rank R --hang-after K
                  rank R completes steps 0..K-1 and then, in step K, right before the gradient
                  all-reduce (allreduce mode: after backward; ddp mode: before loss.backward(),
                  where DDP's all-reduce happens) sleeps forever. The other ranks block in that
                  collective (gloo's timeout, --pg-timeout-s, default 1800 s, ends them).
--fail-rank R --fail-after K
                  elastic restart: in the job's first attempt (TORCHELASTIC_RESTART_COUNT 0) rank R
                  completes steps 0..K-1, writes its truth (status "failed") and exits with
                  status 1; torchrun (--max-restarts >= 1) stops the other ranks and starts every
                  rank again. Later attempts run all --steps and end normally.

Harness protocol (all files in --truth-dir, written with write + rename; in a restarted attempt
k >= 1 (TORCHELASTIC_RESTART_COUNT) every name below gets ".restart<k>" before its extension,
the --ready file included: rank<R>.restart1.pid, ready.restart1, ...):
  rank<R>.pid         once the rank is ready to wait for --ready (after init_process_group, model
                      build and 2 warm-up steps): {"rank","local_rank","world_size","pid","tid",
                      "ppid","mode","restart"}. The same JSON is printed as one stdout line.
  --ready FILE        every rank polls for FILE (every 5 ms) before its first measured step.
  progress-rank<R>.log one line per finished step: "<index> <t_end CLOCK_MONOTONIC ns>", flushed.
  truth-rank<R>.json  at exit; in a hang run, by every rank right before it enters the hung step's
                      collective (status "hung" for the hang rank, "blocked" for the others: they
                      never exit on their own).
The truth is described in tests/README.md ("Multi-rank workload").
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

now = time.monotonic_ns  # CLOCK_MONOTONIC on Linux, the clock of bpf_ktime_get_ns
MS = 1_000_000
PHASES = ("input_wait", "h2d", "forward", "backward", "collective_wait", "optimizer", "gpu_wait", "residual")


SLEEP = False  # --straggler-how sleep


def burn(ns):
    """Busy CPU loop until ns of CLOCK_MONOTONIC have passed (or sleep them, --straggler-how sleep)."""
    if ns <= 0:
        return
    end = now() + ns
    if SLEEP:
        while now() < end:
            time.sleep(max(0, end - now()) / 1e9)
        return
    while now() < end:
        pass


def write_json(path, obj, indent=None):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=indent)
    os.replace(tmp, path)


def median(xs):
    xs = [x for x in xs if x is not None]
    return int(statistics.median(xs)) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("ddp", "allreduce"), default="ddp")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--flatten", action="store_true",
                    help="allreduce mode: one all_reduce of all gradients flattened into one tensor per step")
    ap.add_argument("--straggler-rank", type=int)
    ap.add_argument("--straggler-phase", choices=("compute", "input"), default="compute")
    ap.add_argument("--straggler-ms", type=float, default=15.0)
    ap.add_argument("--straggler-from", type=int, default=0,
                    help="the straggler is slow from this step on (0-based; a transient episode)")
    ap.add_argument("--straggler-to", type=int, help="... and before this step (default: to the end)")
    ap.add_argument("--straggler-every", type=int,
                    help="rotating: the slow rank is (step // N) % world_size, N steps each")
    ap.add_argument("--straggler-how", choices=("busy", "sleep"), default="busy",
                    help="busy: CPU loop (steals a core from the other ranks on a small machine); sleep: "
                         "time.sleep (the same extra wall time without CPU contention)")
    ap.add_argument("--hang-rank", type=int)
    ap.add_argument("--hang-after", type=int, default=10, help="the hang rank stops in step K (0-based)")
    ap.add_argument("--desync-rank", type=int,
                    help="allreduce mode: in step --desync-step this rank calls another collective "
                         "(--desync-how op: dist.broadcast) or none (skip) where the others all-reduce")
    ap.add_argument("--desync-step", type=int, default=10)
    ap.add_argument("--desync-how", choices=("op", "skip"), default="op")
    ap.add_argument("--fail-rank", type=int, help="first attempt only: this rank exits with status 1")
    ap.add_argument("--fail-after", type=int, default=10, help="the fail rank exits after K steps")
    ap.add_argument("--truth-dir", help="where rank<R>.pid, progress-rank<R>.log and truth-rank<R>.json go")
    ap.add_argument("--ready", help="every rank waits for this file before its first measured step")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3, help="hidden Linear layers (each hidden x hidden)")
    ap.add_argument("--getitem-us", type=float, default=300.0,
                    help="busy time of every rank's __getitem__ (one call per step)")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size (default one bucket)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pg-timeout-s", type=float, default=1800.0)
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                    help="nccl: model and batches on cuda:LOCAL_RANK (one GPU per rank; cargo xtask gpu-check)")
    ap.add_argument("--node-tag", help="unused: marks this node's command lines (a test's serve "
                    "includes only its own node's ranks when two nodes share one machine)")
    a = ap.parse_args()
    global SLEEP
    SLEEP = a.straggler_how == "sleep"

    import datetime
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    dev = torch.device("cuda", local_rank) if a.backend == "nccl" else torch.device("cpu")
    if a.backend == "nccl":
        torch.cuda.set_device(dev)
    timeout = datetime.timedelta(seconds=a.pg_timeout_s)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart:
        # A restarted attempt meets in a store prefix of its own: in torch 2.15 the elastic
        # agent's store keeps the previous attempt's gloo addresses under the default group's
        # keys, and a restarted rank may read one and fail to connect (connection refused).
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=not agent_store and os.environ["RANK"] == "0",
                              timeout=timeout)
        dist.init_process_group(a.backend, store=dist.PrefixStore("attempt%d" % restart, store),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timeout)
    else:
        dist.init_process_group(a.backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    straggler = (a.straggler_rank is not None and a.straggler_rank == rank) or a.straggler_every is not None
    burn_compute_ns = int(a.straggler_ms * MS) if straggler and a.straggler_phase == "compute" else 0

    def slow_at(i):
        """Whether this rank is the slow one in step i (--straggler-from/-to/-every)."""
        if a.straggler_every is not None:
            return (i // a.straggler_every) % world == rank
        return straggler and i >= a.straggler_from and (a.straggler_to is None or i < a.straggler_to)
    burn_input_ns = int(a.straggler_ms * MS) if straggler and a.straggler_phase == "input" else 0
    hang_step = a.hang_after if a.hang_rank is not None else None
    is_hang_rank = a.hang_rank is not None and a.hang_rank == rank
    tdir = a.truth_dir
    if tdir:
        os.makedirs(tdir, exist_ok=True)

    def attempt_name(name):
        """name in this attempt: ".restart<k>" before the extension from the first restart on."""
        if not restart:
            return name
        stem, dot, ext = name.rpartition(".")
        return "%s.restart%d.%s" % (stem, restart, ext) if dot else "%s.restart%d" % (name, restart)

    fail_step = a.fail_after if a.fail_rank is not None and a.fail_rank == rank and restart == 0 else None

    B, D = a.batch_size, 64
    getitem_ns = int(a.getitem_us * 1000)
    input_clock = {"span": None, "burn": 0}

    class SyntheticDataset(Dataset):
        """One item = one batch (DataLoader(batch_size=None)), so the input cost is one
        __getitem__ call per step: --getitem-us of busy time, plus the straggler's burn."""

        def __init__(self, n_batches):
            g = torch.Generator().manual_seed(1000 + rank)
            self.x = torch.randn(n_batches, B, D, generator=g)
            self.y = torch.randn(n_batches, B, 1, generator=g)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            t = now()
            b = burn_input_ns if slow_at(i) else 0
            burn(getitem_ns + b)
            input_clock["burn"] += b
            out = self.x[i], self.y[i]
            input_clock["span"] = (t, now())
            return out

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            H = a.hidden
            layers = [nn.Linear(D, H), nn.ReLU()]
            for _ in range(a.layers):
                layers += [nn.Linear(H, H), nn.ReLU()]
            layers.append(nn.Linear(H, 1))
            self.net = nn.Sequential(*layers)
            self.burn_ns = 0

        def forward(self, x):
            burn(self.burn_ns)  # the compute straggler: extra CPU time inside forward
            return self.net(x)

    mlp = MLP().to(dev)
    if a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(mlp, bucket_cap_mb=a.bucket_cap_mb,
                    device_ids=[local_rank] if a.backend == "nccl" else None)
    else:
        model = mlp
    params = [p for p in mlp.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    lossf = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    # DDP: the arrival at the all-reduce is when the last gradient is ready (DDP's reducer launches
    # the bucket from the AccumulateGrad post hook, right after these tensor hooks). Recorded per
    # step for the estimate; it does not change DDP's native collective path.
    grad_ready = {"last": None}
    if a.mode == "ddp":
        def on_ready(_p):
            grad_ready["last"] = now()
        for p in params:
            p.register_post_accumulate_grad_hook(on_ready)

    coll = {"ns": 0, "calls": 0, "bytes": 0, "first": None, "last": None, "pack": 0, "each": []}

    def all_reduce_grads():
        if a.flatten:
            t = now()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            t0 = now()
            dist.all_reduce(flat)
            t1 = now()
            flat.div_(world)
            off = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[off:off + n].view_as(p.grad))
                off += n
            t2 = now()
            coll["ns"] += t1 - t0
            coll["each"].append(t1 - t0)
            coll["calls"] += 1
            coll["bytes"] += flat.numel() * flat.element_size()
            coll["first"] = coll["first"] or t0
            coll["last"] = t1
            coll["pack"] += (t0 - t) + (t2 - t1)
        else:
            for p in params:
                t0 = now()
                dist.all_reduce(p.grad)
                t1 = now()
                p.grad.div_(world)
                t2 = now()
                coll["ns"] += t1 - t0
                coll["each"].append(t1 - t0)
                coll["calls"] += 1
                coll["bytes"] += p.grad.numel() * p.grad.element_size()
                coll["first"] = coll["first"] or t0
                coll["last"] = t1
                coll["pack"] += t2 - t1

    def train_step(x, y):
        opt.zero_grad()
        loss = lossf(model(x), y)
        loss.backward()
        if a.mode == "allreduce":
            all_reduce_grads()
        opt.step()

    # Two warm-up steps outside the measurement (lazy init; DDP rebuilds its buckets after its
    # first iteration).
    for _ in range(2):
        train_step(torch.randn(B, D, device=dev), torch.randn(B, 1, device=dev))

    tid = threading.get_native_id()
    ident = {"rank": rank, "local_rank": local_rank, "world_size": world, "pid": os.getpid(), "tid": tid,
             "ppid": os.getppid(), "mode": a.mode, "restart": restart}
    if tdir:
        write_json(os.path.join(tdir, attempt_name("rank%d.pid" % rank)), ident)
    print(json.dumps(ident), flush=True)
    ready = a.ready and os.path.join(os.path.dirname(a.ready), attempt_name(os.path.basename(a.ready)))
    while ready and not os.path.exists(ready):
        time.sleep(0.005)
    mlp.burn_ns = burn_compute_ns
    progress = open(os.path.join(tdir, attempt_name("progress-rank%d.log" % rank)), "a", buffering=1) if tdir else None

    loader = DataLoader(SyntheticDataset(a.steps), batch_size=None, shuffle=False, num_workers=0)
    raw = []
    status = {"value": "running"}
    hang = None
    desync = None

    def truth(final_t):
        steps = []
        for i, r in enumerate(raw):
            t_end = raw[i + 1]["t0"] if i + 1 < len(raw) else final_t
            ph = {"input_wait": r["t1"] - r["t0"], "h2d": 0, "forward": r["t4"] - r["t2"],
                  "backward": r["t5"] - r["t4"], "collective_wait": r["coll_ns"] if a.mode == "allreduce" else 0,
                  "optimizer": r["t7"] - r["t6"], "gpu_wait": 0}
            ph["residual"] = (t_end - r["t0"]) - sum(ph.values())
            s = {"index": i, "t_start_ns": r["t0"], "t_end_ns": t_end, "wall_ns": t_end - r["t0"], "phases_ns": ph,
                 "zero_grad_ns": r["t2"] - r["t1"], "loss_fn_ns": r["t4"] - r["t3"],
                 "dataset_ns": r["ds_ns"], "straggler_burn_ns": r["burn_ns"]}
            if a.mode == "allreduce":
                s.update({"collective_calls": r["coll_calls"], "collective_bytes": r["coll_bytes"],
                          "collective_call_ns": r["coll_each"],
                          "collective_enter_ns": r["coll_first"], "collective_exit_ns": r["coll_last"],
                          "grad_pack_ns": r["pack_ns"], "own_work_ns": s["wall_ns"] - ph["collective_wait"]})
            else:
                # the backward span = autograd up to the last gradient + DDP's all-reduce wait
                # (finalize_backward) + copying the bucket back; the last two are the estimate
                est = r["t5"] - r["grad_ready"] if r["grad_ready"] else None
                s.update({"grads_ready_ns": r["grad_ready"], "collective_wait_est_ns": est,
                          "backward_compute_est_ns": (r["t5"] - r["t4"] - est) if est is not None else None,
                          "own_work_ns": s["wall_ns"] - est if est is not None else None})
                if est is not None:
                    # what a daemon that splits the DDP wait out of backward should find
                    s["phases_est_ns"] = dict(ph, backward=ph["backward"] - est, collective_wait=est)
            steps.append(s)
        med = {p: median(s["phases_ns"][p] for s in steps) for p in PHASES}
        out = {
            "format": "traceml-truth-ddp/1", "backend": "torch-cpu+gloo" if a.backend == "gloo" else "torch-cuda+nccl", "mode": a.mode,
            "torch_version": torch.__version__, "python": sys.version.split()[0],
            **ident, "clock": "CLOCK_MONOTONIC",
            "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                   "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                                                   "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                                                   "TORCHELASTIC_MAX_RESTARTS")},
            "config": {k: v for k, v in vars(a).items()},
            "model": {"params": n_params, "grad_bytes": grad_bytes, "tensors": len(params)},
            "is_straggler": straggler,
            "straggler": ({"rank": a.straggler_rank, "phase": a.straggler_phase, "ms": a.straggler_ms,
                           "how": a.straggler_how}
                          if a.straggler_rank is not None else None),
            "status": status["value"], "hang": hang, "desync": desync, "restart": restart,
            "collective": (
                {"measurable": True, "op": "dist.all_reduce (sync, SUM)",
                 "calls_per_step": 1 if a.flatten else len(params),
                 "bytes_per_step": grad_bytes,
                 "note": "collective_wait = time inside the dist.all_reduce calls, from Python"}
                if a.mode == "allreduce" else
                {"measurable": False, "op": "DDP reducer all-reduce (gloo) inside loss.backward()",
                 "bytes_per_step": grad_bytes,
                 "note": "the wait happens inside backward (Reducer::finalize_backward) and is not "
                         "visible to Python: phases_ns.collective_wait is 0 and backward includes it; "
                         "collective_wait_est_ns = backward end - last gradient ready (upper bound: "
                         "includes the bucket copy-back, tens of us)"}),
            "step_count": len(steps), "steps": steps,
            "median_phases_ns": med,
            "median_step_ns": median(s["wall_ns"] for s in steps),
            "median_own_work_ns": median(s["own_work_ns"] for s in steps),
        }
        if a.mode == "ddp":
            out["median_collective_wait_est_ns"] = median(s["collective_wait_est_ns"] for s in steps)
            out["median_phases_est_ns"] = {p: median(s.get("phases_est_ns", {}).get(p) for s in steps)
                                           for p in PHASES}
        return out

    def dump(final_t):
        if tdir:
            write_json(os.path.join(tdir, attempt_name("truth-rank%d.json" % rank)), truth(final_t), indent=1)

    t_stop = None
    it = iter(loader)
    for i in range(a.steps + 1):
        if fail_step == i:
            # the first attempt's failure: the truth of the steps done, then a non-zero exit
            status["value"] = "failed"
            dump(now())
            if progress:
                progress.close()
            sys.stdout.flush()
            os._exit(1)
        t0 = now()
        step_burn_ns = burn_compute_ns if slow_at(i) else 0
        mlp.burn_ns = step_burn_ns
        input_clock.update(span=None, burn=0)
        try:
            x, y = next(it)
            if a.backend == "nccl":
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        except StopIteration:
            t_stop = t0  # the last step ends where the final next() begins
            break
        t1 = now()
        ds_ns = input_clock["span"][1] - input_clock["span"][0] if input_clock["span"] else 0
        burn_ns = input_clock["burn"]
        opt.zero_grad()
        t2 = now()
        out = model(x)
        t3 = now()
        loss = lossf(out, y)
        t4 = now()
        if a.mode == "ddp" and hang_step == i:
            # DDP's all-reduce runs inside backward: stop before it
            status["value"] = "hung" if is_hang_rank else "blocked"
            hang = {"step": i, "t_ns": t4, "where": "sleep before loss.backward()" if is_hang_rank
                    else "about to enter loss.backward() (DDP all-reduce, blocked on the hang rank)"}
            dump(t0)
            if is_hang_rank:
                while True:
                    time.sleep(3600)
        grad_ready["last"] = None
        loss.backward()
        t5 = now()
        for k in ("ns", "calls", "bytes", "pack"):
            coll[k] = 0
        coll["first"] = coll["last"] = None
        coll["each"] = []
        if a.mode == "allreduce":
            if hang_step == i:
                status["value"] = "hung" if is_hang_rank else "blocked"
                hang = {"step": i, "t_ns": t5, "where": "sleep before dist.all_reduce" if is_hang_rank
                        else "about to enter dist.all_reduce (blocked on the hang rank)"}
                dump(t0)
                if is_hang_rank:
                    while True:
                        time.sleep(3600)
            if a.desync_rank is not None and i == a.desync_step:
                # The collectives every rank issued in the measured steps before this one: the
                # number (from 0) of the collective where the ranks disagree.
                status["value"] = "desync"
                calls = sum(r["coll_calls"] for r in raw)
                desync = {"step": i, "t_ns": t5, "rank": a.desync_rank, "how": a.desync_how,
                          "seq": calls, "others_op": "all_reduce",
                          "op": "broadcast" if a.desync_how == "op" else None}
                dump(t0)
                if rank == a.desync_rank:
                    if a.desync_how == "op":
                        flat = torch.cat([p.grad.reshape(-1) for p in params])
                        dist.broadcast(flat, src=0)
                    # skip: no collective in this step
                else:
                    all_reduce_grads()
            else:
                all_reduce_grads()
        t6 = now()
        opt.step()
        t7 = now()
        del out, loss, x, y
        t8 = now()
        raw.append({"t0": t0, "t1": t1, "t2": t2, "t3": t3, "t4": t4, "t5": t5, "t6": t6,
                    "t7": t7, "t8": t8, "ds_ns": ds_ns, "burn_ns": burn_ns + step_burn_ns,
                    "coll_ns": coll["ns"], "coll_calls": coll["calls"], "coll_bytes": coll["bytes"],
                    "coll_first": coll["first"], "coll_last": coll["last"], "pack_ns": coll["pack"],
                    "coll_each": coll["each"],
                    "grad_ready": grad_ready["last"]})
        if progress:
            progress.write("%d %d\n" % (i, t8))
    status["value"] = "completed"
    dump(t_stop)
    res = truth(t_stop)
    print(json.dumps({"done": True, "rank": rank, "steps": res["step_count"],
                      "step_median_ms": round(res["median_step_ns"] / 1e6, 2),
                      "median_ms": {p: round(v / 1e6, 2) for p, v in res["median_phases_ns"].items() if v},
                      **({"collective_wait_est_ms": round(res["median_collective_wait_est_ns"] / 1e6, 2)}
                         if a.mode == "ddp" else {})}), flush=True)
    if a.desync_rank is not None:
        # As a script that saves a checkpoint would: every rank meets the others at a barrier
        # after its loop. After a skip, the skipping rank's barrier is paired with the others'
        # last all_reduce (calls pair by order): the desync shows there.
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
