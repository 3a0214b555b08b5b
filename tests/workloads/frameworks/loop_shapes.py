"""Real-PyTorch workloads (CPU): training loops in shapes popular code writes that a step detector
can get wrong (issue 38): two DataLoaders zipped, nanoGPT's get_batch() without a DataLoader, a
feeder thread filling a queue, CPU augmentation between the fetch and the forward, evaluation
under no_grad / inference_mode with and without a DataLoader, epochs with a pause between them,
gradient accumulation over 128 tiny micro-batches, and a torch.compile'd model.

Usage: python loop_shapes.py --mode MODE [--steps N] [--ready FILE] [--truth FILE]
                             [--steps-log FILE] [--threads N]
  zipped_slow_first   `for (xa, ya), (xb, _) in zip(dl_slow, dl_fast)`: a labelled loader whose
                      __getitem__ sleeps (input ~80 % of the step) fetched first, an unlabelled
                      fast one second; one forward on each batch, one loss (cross entropy on the
                      labelled batch + a consistency term on the other), backward, step, zero_grad
  zipped_slow_second  the same with the slow loader second: zip(dl_fast, dl_slow)
  get_batch           nanoGPT: no DataLoader; get_batch() opens the token file with np.memmap
                      each call, reads random windows and sleeps 60 ms (slow storage); input ~85 %
  feeder_queue        a threading.Thread iterates a DataLoader (slow __getitem__) and puts its
                      batches in a queue.Queue(maxsize=2); the main thread trains on q.get();
                      input (the q.get() wait) ~90 %
  cpu_augment         a fast DataLoader, then augment(x) on the training thread (noise, random
                      flip, per-sample normalisation, mixup and a short sleep); input = fetch +
                      augmentation, ~70 %
  nograd_eval_dl      compute-bound training (a DataLoader of pre-batched tensors); every 10
                      optimizer steps a `torch.no_grad()` evaluation over a DataLoader of 6 batches
  nograd_eval_nodl    the same evaluation over a list of 6 pre-loaded (x, y) tensors, no DataLoader
  inference_eval      nograd_eval_dl with `torch.inference_mode()`
  epochs              4 epochs over a DataLoader of steps/4 batches (input ~70 %); --steps 0 (the
                      default) sizes the epochs to ~6 s each at the step time measured at
                      start-up, so that the daemon's learning probe set (0.5-10 s) ends in the
                      first; between epochs a checkpoint-like pause (torch.save of the state dict
                      to memory, then sleep to 200 ms)
  accum128            gradient accumulation of 128 micro-batches of 2 samples per optimizer step
                      (`if (i + 1) % 128 == 0: opt.step()`), each ~2 ms: ~0.7 ms forward +
                      backward and a DataLoader(batch_size=None) whose __getitem__ returns a
                      whole micro-batch after a sleep (input ~70 %).
                      Starts training right after its start line, NOT waiting for --ready (the
                      ready file is accepted and ignored): the daemon attaches while a window
                      is in progress, and the truth covers every step, also those before the
                      attach (a harness compares from the attach on)
  compiled            torch.compile(model) (inductor, CPU), compiled on the first step, after
                      --ready, with a fresh inductor cache (so the daemon sees dynamo trace, deep
                      Python stacks, and inductor run g++ as child processes); a single-process
                      DataLoader whose __getitem__ sleeps (input ~60 % of a compiled step); no
                      DataLoader workers (truth: `worker_processes` 0)
Model: Linear(256,1024) + 2 x Linear(1024,1024) + Linear(1024,10), ReLUs, SGD momentum 0.9, batch
64: forward ~3.5 ms, backward ~7 ms, optimizer ~3 ms with torch.set_num_threads(1) (accum128: a
256-384-384-384-10 MLP; get_batch: Embedding + 3 Linear over 512 tokens, AdamW). The input modes
size their sleeps from the model's step time measured at start-up (`config.calibration`), so
the input share is near the intended one on any machine; the truth is measured all the same.

Truth clocks (all time.monotonic_ns(), CLOCK_MONOTONIC; format: tests/README.md):
  input_wait  every batch fetch on the training thread: each DataLoader iterator `__next__` that
              returns a batch, whole (truthlib.clock_dataloader_next; both loaders of a zip),
              get_batch(), q.get(), and cpu_augment's augment(x) (input preparation; also per
              step as `augment_ns`). The feeder thread's own fetches are no part of any step
              (`feeder` reports them)
  forward     model call(s) + loss; backward loss.backward(); optimizer opt.step()
  step end    after opt.step() and opt.zero_grad(); a step runs from one step end to the next
              (step 0 from its first fetch), less any evaluation or epoch gap inside it
  evaluation  the evaluate() call, model.eval() to model.train() (`evaluation.spans_ns`)
  epoch gap   from the last step end of an epoch to the first fetch of the next (the final
              StopIteration `next()`, the checkpoint and the pause): in no step
              (`epoch_gaps_ns`)
"""
import io
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import truthlib  # noqa: E402
from truthlib import MS, now  # noqa: E402

MODES = {
    "zipped_slow_first": dict(steps=100, input_share=0.80),
    "zipped_slow_second": dict(steps=100, input_share=0.80),
    "get_batch": dict(steps=150, storage_sleep_ms=60),
    "feeder_queue": dict(steps=100, input_share=0.90, queue_size=2),
    "cpu_augment": dict(steps=200, input_share=0.70),
    "nograd_eval_dl": dict(steps=300, eval_every=10, eval_batches=6, eval_ctx="no_grad",
                           eval_loader=True),
    "nograd_eval_nodl": dict(steps=300, eval_every=10, eval_batches=6, eval_ctx="no_grad",
                             eval_loader=False),
    "inference_eval": dict(steps=300, eval_every=10, eval_batches=6, eval_ctx="inference_mode",
                           eval_loader=True),
    "epochs": dict(steps=0, epochs=4, input_share=0.70, pause_ms=200, epoch_s=6.0),
    "accum128": dict(steps=60, accum=128, micro_batch=2, input_share=0.70),
    "compiled": dict(steps=150, input_share=0.60),
}
BATCH, FEATURES, HIDDEN, LAYERS, CLASSES = 64, 256, 1024, 3, 10
POOL = 1024
EVAL_BATCH, EVAL_GETITEM_NS, EVAL_BATCH_NODL = 128, 60_000, 512
SLEEP_OVERHEAD_NS = 60_000  # what one time.sleep() adds to its argument (timer slack, the call)


def main():
    a = truthlib.parse("training-loop shapes, real PyTorch on CPU", list(MODES),
                       {k: v["steps"] for k, v in MODES.items()})
    cfg = dict(MODES[a.mode], steps=a.steps, threads=a.threads)
    if a.mode == "compiled":
        # A fresh cache: inductor compiles (and runs g++) on the first step, under the daemon.
        import atexit
        import shutil
        cache = tempfile.mkdtemp(prefix="loop-shapes-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        atexit.register(shutil.rmtree, cache, True)
    import numpy as np
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    clock = truthlib.Clock(a.steps_log)
    if a.mode != "feeder_queue":
        truthlib.clock_dataloader_next(clock)
    mode = a.mode

    class Synthetic(Dataset):
        """`n` samples (rows of a fixed random pool); __getitem__ sleeps `getitem_ns` (slow
        storage or decoding); `batch`: whole batches per item (DataLoader(batch_size=None))."""

        def __init__(self, n, getitem_ns=0, batch=None, features=FEATURES, seed=0):
            g = torch.Generator().manual_seed(seed)
            self.n, self.getitem_ns, self.batch = n, getitem_ns, batch
            self.x = torch.randn(POOL, features, generator=g)
            self.y = torch.randint(0, CLASSES, (POOL,), generator=g)

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.getitem_ns:
                time.sleep(self.getitem_ns / 1e9)
            if self.batch:
                j = (i * self.batch) % (POOL - self.batch)
                return self.x[j:j + self.batch], self.y[j:j + self.batch]
            return self.x[i % POOL], self.y[i % POOL]

    def mlp(features=FEATURES, hidden=HIDDEN, layers=LAYERS):
        mods, width = [], features
        for _ in range(layers):
            mods += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        return nn.Sequential(*mods, nn.Linear(width, CLASSES))

    def median_ns(fn, n=9):
        ts = []
        for _ in range(n):
            t0 = now()
            fn()
            ts.append(now() - t0)
        return int(statistics.median(ts))

    def per_item_sleep_ns(input_ns, items):
        return max(0, input_ns // items - SLEEP_OVERHEAD_NS)

    def input_ns_for(share, compute_ns):
        """Input time that makes `share` of a step whose other work is `compute_ns`."""
        return int(compute_ns * share / (1.0 - share))

    lossf = nn.CrossEntropyLoss()
    counts = {}
    extra = {}
    spans_extra = ()
    phase_input = ["input_wait"]
    run = None  # the training loop, set per mode below
    evaluate = None

    # ---------------------------------------------------------------------------------------
    if mode in ("zipped_slow_first", "zipped_slow_second"):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x0, y0 = torch.randn(BATCH, FEATURES), torch.randint(0, CLASSES, (BATCH,))

        def train_on(xa, ya, xb):
            with clock.phase("forward"):
                out_a, out_b = model(xa), model(xb)
                # Cross entropy on the labelled batch, a consistency term on the unlabelled one
                # (semi-supervised style).
                loss = lossf(out_a, ya) + 0.1 * out_b.pow(2).mean()
            with clock.phase("backward"):
                loss.backward()
            with clock.phase("optimizer"):
                opt.step()
            opt.zero_grad()

        compute = median_ns(lambda: train_on(x0, y0, x0))
        slow = Synthetic(cfg["steps"] * BATCH, seed=1)
        fast = Synthetic(cfg["steps"] * BATCH, seed=2)
        slow.getitem_ns = per_item_sleep_ns(input_ns_for(cfg["input_share"], compute), BATCH)
        cfg["calibration"] = {"compute_ns": compute, "slow_getitem_ns": slow.getitem_ns}
        dl_slow = DataLoader(slow, batch_size=BATCH, shuffle=True)
        dl_fast = DataLoader(fast, batch_size=BATCH, shuffle=True)

        def run():
            if mode == "zipped_slow_first":
                for (xa, ya), (xb, _) in zip(dl_slow, dl_fast):
                    train_on(xa, ya, xb)
                    clock.step_end()
            else:
                for (xb, _), (xa, ya) in zip(dl_fast, dl_slow):
                    train_on(xa, ya, xb)
                    clock.step_end()
        counts["batches_fetched"] = 2 * cfg["steps"]

    # ---------------------------------------------------------------------------------------
    elif mode == "get_batch":
        vocab, block, batch, emb, hidden = 512, 64, 8, 64, 256
        data_dir = tempfile.mkdtemp(prefix="traceml-get-batch-")
        path = os.path.join(data_dir, "train.bin")
        rng = np.random.default_rng(0)
        rng.integers(0, vocab, size=2_000_000, dtype=np.uint16).tofile(path)

        def get_batch():
            # nanoGPT's: a new memmap every call (avoids its memory leak), random windows.
            data = np.memmap(path, dtype=np.uint16, mode="r")
            ix = torch.randint(len(data) - block, (batch,))
            x = torch.stack([torch.from_numpy(data[i:i + block].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block].astype(np.int64))
                             for i in ix])
            time.sleep(cfg["storage_sleep_ms"] / 1e3)  # slow storage
            return x, y

        model = nn.Sequential(nn.Embedding(vocab, emb), nn.Linear(emb, hidden), nn.ReLU(),
                              nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, vocab))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def run():
            for _ in range(cfg["steps"]):
                with clock.phase("input_wait"):
                    X, Y = get_batch()
                with clock.phase("forward"):
                    logits = model(X)
                    loss = nn.functional.cross_entropy(logits.view(-1, vocab), Y.view(-1))
                with clock.phase("backward"):
                    loss.backward()
                with clock.phase("optimizer"):
                    opt.step()
                opt.zero_grad(set_to_none=True)
                clock.step_end()
        x0, y0 = get_batch()
        warm = lambda: (nn.functional.cross_entropy(model(x0).view(-1, vocab),  # noqa: E731
                                                    y0.view(-1)).backward(), opt.step(),
                        opt.zero_grad())
        cfg["calibration"] = {"compute_ns": median_ns(warm, 5)}
        cfg["model"] = dict(vocab=vocab, block=block, batch=batch, emb=emb, hidden=hidden)
        counts["batches_fetched"] = cfg["steps"]

    # ---------------------------------------------------------------------------------------
    elif mode == "feeder_queue":
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x0, y0 = torch.randn(BATCH, FEATURES), torch.randint(0, CLASSES, (BATCH,))

        def train_on(x, y):
            with clock.phase("forward"):
                loss = lossf(model(x), y)
            with clock.phase("backward"):
                loss.backward()
            with clock.phase("optimizer"):
                opt.step()
            opt.zero_grad()

        compute = median_ns(lambda: train_on(x0, y0))
        ds = Synthetic(cfg["steps"] * BATCH)
        # The feeder delivers a batch every compute/(1 - share): the main thread waits the rest.
        ds.getitem_ns = per_item_sleep_ns(int(compute / (1.0 - cfg["input_share"])), BATCH)
        cfg["calibration"] = {"compute_ns": compute, "getitem_ns": ds.getitem_ns}
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True)
        feeder_clock = truthlib.Clock()
        truthlib.clock_dataloader_next(feeder_clock, phase="feeder_fetch")
        q = queue.Queue(maxsize=cfg["queue_size"])
        feeder_tid = []

        def feed():
            feeder_tid.append(threading.get_native_id())
            for batch in loader:
                q.put(batch)
            q.put(None)

        def run():
            feeder = threading.Thread(target=feed, name="feeder", daemon=True)
            feeder.start()
            while True:
                with clock.phase("input_wait"):
                    batch = q.get()
                if batch is None:
                    clock.spans["input_wait"].pop()  # the end marker: no batch
                    break
                train_on(*batch)
                clock.step_end()
            feeder.join()
            fetches = feeder_clock.spans.get("feeder_fetch", [])
            extra["feeder"] = {"tid": feeder_tid[0] if feeder_tid else None,
                               "fetches": len(fetches),
                               "fetch_ns_total": sum(t1 - t0 for t0, t1 in fetches)}
        counts["batches_fetched"] = cfg["steps"]

    # ---------------------------------------------------------------------------------------
    elif mode == "cpu_augment":
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x0, y0 = torch.randn(BATCH, FEATURES), torch.randint(0, CLASSES, (BATCH,))
        aug_sleep = [0]

        def augment(x, y):
            x = x + 0.05 * torch.randn_like(x)  # noise
            flip = torch.rand(x.shape[0]) < 0.5  # random flip of the feature axis
            x = torch.where(flip[:, None], x.flip(1), x)
            x = (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-6)
            lam = float(torch.distributions.Beta(0.4, 0.4).sample())  # mixup
            perm = torch.randperm(x.shape[0])
            x = lam * x + (1 - lam) * x[perm]
            time.sleep(aug_sleep[0] / 1e9)  # decoding, a Python-side transform
            return x, y, y[perm], lam

        def train_on(x, ya, yb, lam):
            with clock.phase("forward"):
                out = model(x)
                loss = lam * lossf(out, ya) + (1 - lam) * lossf(out, yb)
            with clock.phase("backward"):
                loss.backward()
            with clock.phase("optimizer"):
                opt.step()
            opt.zero_grad()

        compute = median_ns(lambda: train_on(x0, y0, y0, 0.5))
        ds = Synthetic(cfg["steps"] * BATCH)
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True)
        it = iter(loader)
        fetch_aug = median_ns(lambda: augment(*next(it)), 5)
        aug_sleep[0] = max(0, input_ns_for(cfg["input_share"], compute) - fetch_aug
                           - SLEEP_OVERHEAD_NS)
        cfg["calibration"] = {"compute_ns": compute, "fetch_and_ops_ns": fetch_aug,
                              "augment_sleep_ns": aug_sleep[0]}
        augment_t = clock.timed("augment", augment)
        phase_input = ["input_wait", "augment"]
        spans_extra = ("augment",)

        def run():
            for x, y in loader:
                x, ya, yb, lam = augment_t(x, y)
                train_on(x, ya, yb, lam)
                clock.step_end()
        counts["batches_fetched"] = cfg["steps"]

    # ---------------------------------------------------------------------------------------
    elif mode in ("nograd_eval_dl", "nograd_eval_nodl", "inference_eval"):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        # Pre-batched training data (DataLoader(batch_size=None)): the fetch is ~20 us, the
        # training steps compute-bound.
        train = DataLoader(Synthetic(cfg["steps"], batch=BATCH), batch_size=None, shuffle=True)
        eval_ds = Synthetic(cfg["eval_batches"] * EVAL_BATCH, EVAL_GETITEM_NS, seed=3)
        eval_dl = DataLoader(eval_ds, batch_size=EVAL_BATCH)
        g = torch.Generator().manual_seed(4)
        eval_tensors = [(torch.randn(EVAL_BATCH_NODL, FEATURES, generator=g),
                         torch.randint(0, CLASSES, (EVAL_BATCH_NODL,), generator=g))
                        for _ in range(cfg["eval_batches"])]
        ctx = torch.no_grad if cfg["eval_ctx"] == "no_grad" else torch.inference_mode

        def evaluate():
            t0 = now()
            model.eval()
            correct = total = 0
            with ctx():
                for x, y in (eval_dl if cfg["eval_loader"] else eval_tensors):
                    out = model(x)
                    lossf(out, y).item()
                    correct += int((out.argmax(1) == y).sum())
                    total += len(y)
            model.train()
            clock.span("evaluation", t0, now())
            return correct / max(total, 1)

        def run():
            for step, (x, y) in enumerate(train):
                with clock.phase("forward"):
                    loss = lossf(model(x), y)
                with clock.phase("backward"):
                    loss.backward()
                with clock.phase("optimizer"):
                    opt.step()
                opt.zero_grad()
                clock.step_end()
                if (step + 1) % cfg["eval_every"] == 0 and step + 1 < cfg["steps"]:
                    evaluate()
        counts["batches_fetched"] = cfg["steps"]

    # ---------------------------------------------------------------------------------------
    elif mode == "epochs":
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x0, y0 = torch.randn(BATCH, FEATURES), torch.randint(0, CLASSES, (BATCH,))

        def train_on(x, y):
            with clock.phase("forward"):
                loss = lossf(model(x), y)
            with clock.phase("backward"):
                loss.backward()
            with clock.phase("optimizer"):
                opt.step()
            opt.zero_grad()

        compute = median_ns(lambda: train_on(x0, y0))
        step_ns = compute / (1.0 - cfg["input_share"])
        # --steps 0 (the default): epochs of ~epoch_s seconds at the calibrated step time.
        per_epoch = (cfg["steps"] // cfg["epochs"] if cfg["steps"]
                     else max(20, round(cfg["epoch_s"] * 1e9 / step_ns)))
        cfg["steps"] = per_epoch * cfg["epochs"]
        cfg["steps_per_epoch"] = per_epoch
        ds = Synthetic(per_epoch * BATCH)
        ds.getitem_ns = per_item_sleep_ns(input_ns_for(cfg["input_share"], compute), BATCH)
        cfg["calibration"] = {"compute_ns": compute, "getitem_ns": ds.getitem_ns}
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True)
        epoch_ends = []

        def run():
            for epoch in range(cfg["epochs"]):
                for x, y in loader:
                    train_on(x, y)
                    clock.step_end()
                epoch_ends.append(clock.step_ends[-1])
                if epoch + 1 < cfg["epochs"]:
                    t0 = now()  # "checkpoint": the state dict to memory, then the pause
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict()},
                               io.BytesIO())
                    left = cfg["pause_ms"] * MS - (now() - t0)
                    if left > 0:
                        time.sleep(left / 1e9)
            # Each epoch gap: the last step end of an epoch to the next epoch's first fetch.
            fetches = clock.spans["input_wait"]
            for k in range(1, cfg["epochs"]):
                clock.span("epoch_gap", epoch_ends[k - 1], fetches[k * per_epoch][0])
        counts["batches_fetched"] = cfg["steps"]
        counts["epochs"] = cfg["epochs"]

    # ---------------------------------------------------------------------------------------
    elif mode == "accum128":
        model = mlp(hidden=384, layers=3)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        accum, mb = cfg["accum"], cfg["micro_batch"]
        x0, y0 = torch.randn(mb, FEATURES), torch.randint(0, CLASSES, (mb,))
        micro = median_ns(lambda: (lossf(model(x0), y0) / accum).backward(), 20)
        opt.zero_grad()
        # Micro-batches come whole from __getitem__ (DataLoader(batch_size=None)), which sleeps
        # (tokenising, reading) for the intended input share.
        ds = Synthetic(cfg["steps"] * accum, batch=mb)
        ds.getitem_ns = per_item_sleep_ns(input_ns_for(cfg["input_share"], micro), 1)
        loader = DataLoader(ds, batch_size=None, shuffle=True)
        span = clock.span

        def run():
            # Plain clock calls (no context manager): ~1 ms micro-batches.
            for i, (x, y) in enumerate(loader):
                t0 = now()
                loss = lossf(model(x), y) / accum
                t1 = now()
                loss.backward()
                span("forward", t0, t1)
                span("backward", t1, now())
                if (i + 1) % accum == 0:
                    t0 = now()
                    opt.step()
                    span("optimizer", t0, now())
                    opt.zero_grad()
                    clock.step_end()
        cfg["calibration"] = {"micro_batch_compute_ns": micro, "getitem_ns": ds.getitem_ns}
        cfg["ready_gated"] = False
        counts["batches_fetched"] = cfg["steps"] * accum

    # ---------------------------------------------------------------------------------------
    elif mode == "compiled":
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x0, y0 = torch.randn(BATCH, FEATURES), torch.randint(0, CLASSES, (BATCH,))
        fwd = [model]

        def train_on(x, y):
            with clock.phase("forward"):
                loss = lossf(fwd[0](x), y)
            with clock.phase("backward"):
                loss.backward()
            with clock.phase("optimizer"):
                opt.step()
            opt.zero_grad()

        # Calibrated on the eager model; compiled lazily: the first call after --ready compiles.
        compute = median_ns(lambda: train_on(x0, y0))
        fwd[0] = torch.compile(model)
        ds = Synthetic(cfg["steps"] * BATCH)
        ds.getitem_ns = per_item_sleep_ns(input_ns_for(cfg["input_share"], compute), BATCH)
        cfg["calibration"] = {"compute_ns": compute, "getitem_ns": ds.getitem_ns}
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True)
        extra["worker_processes"] = 0

        def run():
            for x, y in loader:
                train_on(x, y)
                clock.step_end()
        counts["batches_fetched"] = cfg["steps"]

    # Warm up outside the measured run (the calibration above ran the model already).
    clock.spans.clear()
    clock.first_start = None
    scenario = "loop_shapes_" + mode
    truthlib.start_line(scenario, torch=torch.__version__, mode=mode)
    if mode != "accum128":
        truthlib.wait_ready(a.ready)
    loop_t0 = now()
    run()
    loop_t1 = now()

    expected = "compute_bound" if "eval" in mode else "input_bound"
    counts.update(optimizer_steps=len(clock.step_ends),
                  micro_batches_per_step=cfg.get("accum", 1),
                  evaluations=len(clock.spans.get("evaluation", [])))
    truth = truthlib.build_truth(
        clock, scenario=scenario, backend="torch-cpu", config=cfg, expected_verdict=expected,
        versions={"torch": torch.__version__, "numpy": np.__version__},
        exclude=("evaluation",), gaps=("epoch_gap",), extra_spans=spans_extra,
        phase_spans={"input_wait": phase_input, "forward": ["forward"],
                     "backward": ["backward"], "optimizer": ["optimizer"]},
        counts=counts)
    truth["mode"] = mode
    truth["training_tid"] = clock.tid
    truth["ready_gated"] = mode != "accum128"
    truth["run_start_ns"], truth["run_end_ns"] = loop_t0, loop_t1
    truth["evaluation"]["spans_ns"] = [list(s) for s in clock.spans.get("evaluation", [])]
    truth["epoch_gaps_ns"] = [list(s) for s in clock.spans.get("epoch_gap", [])]
    truth.update(extra)
    truthlib.write_truth(a.truth, truth)
    truthlib.done_line(truth)
    tot = truth["totals"]
    wall = max(tot["wall_ns"], 1)
    print(json.dumps({
        "mode": mode, "steps": truth["step_count"],
        "duration_s": round((loop_t1 - loop_t0) / 1e9, 2),
        "share": {p: round(tot[p + "_ns"] / wall, 3)
                  for p in ("input_wait", "forward", "backward", "optimizer", "residual")},
        "eval_share_of_loop": round(truth["evaluation"]["wall_ns"] / max(loop_t1 - loop_t0, 1), 3),
        "calibration": cfg.get("calibration")}), flush=True)


if __name__ == "__main__":
    main()
