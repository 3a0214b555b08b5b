"""Real-PyTorch workload: a hand-written training loop (DataLoader, nn.Module, autograd, SGD) on
CPU in the shapes of issue 22: gradient accumulation and evaluation between optimizer steps.

Usage: python plain_loop.py [--mode MODE] [--steps N] [--ready FILE]
                            [--truth FILE] [--steps-log FILE] [--threads N]
  --mode accum:          4 micro-batches (fetch, forward, backward) per optimizer step
  --mode nograd_eval:    every 10 optimizer steps, a `torch.no_grad()` evaluation over 6
                         batches of slow data (__getitem__ sleeps 1 ms per item)
  --mode evalmode_eval:  the same evaluation with only `model.eval()` (autograd on, no backward)
  --mode workers_sleep:  input-bound: a small model (~2 ms of compute a step) behind a
                         DataLoader with 2 worker processes whose __getitem__ sleeps on a
                         batch's first item (a shard read) to the next multiple of 128 ms: the
                         workers deliver in pairs, so every other step waits and the next finds
                         its batch ready
  --mode in_memory:      the same model over the same batches, built in memory before the
                         loop (no DataLoader): workers_sleep with no loading at all
  --mode workers_ready:  workers_sleep's fix: the same model behind the same DataLoader with 2
                         workers that do not sleep, so every batch is ready when the loop asks
                         (what the input what-if assumes: the hand-over of a ready batch stays)
  --mode accelerate:     input-bound: the loop around Hugging Face accelerate (Accelerator on
                         CPU; model, optimizer and a single-process DataLoader whose
                         __getitem__ sleeps 1 ms an item through accelerator.prepare, the
                         backward through accelerator.backward)
The first three are compute-bound in their training steps. Truth format: tests/README.md.

Truth clocks (all from this script, CLOCK_MONOTONIC):
  input_wait  each DataLoader iterator `__next__` call that returns a batch, whole
              (truthlib.clock_dataloader_next)
  forward     model call + loss, backward loss.backward(), optimizer opt.step()
  step end    after opt.step() and zero_grad; a step runs from one step end to the next, less the
              evaluation inside it
  evaluation  the evaluation loop, start to end
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import truthlib  # noqa: E402
from truthlib import MS, now  # noqa: E402

CONFIGS = {
    "accum": dict(steps=30, accum=4, eval_every=0),
    "nograd_eval": dict(steps=60, accum=1, eval_every=10, no_grad=True),
    "evalmode_eval": dict(steps=60, accum=1, eval_every=10, no_grad=False),
    "workers_sleep": dict(steps=160, accum=1, eval_every=0, workers=2, getitem_ns=2 * MS,
                          sleep_per_batch=True,
                          hidden=512, layers=2, verdict="input_bound"),
    "in_memory": dict(steps=1200, accum=1, eval_every=0, in_memory=True, hidden=512, layers=2),
    "workers_ready": dict(steps=1200, accum=1, eval_every=0, workers=2, getitem_ns=0, hidden=512,
                          layers=2),
    "accelerate": dict(steps=40, accum=1, eval_every=0, getitem_ns=MS, accelerate=True,
                       verdict="input_bound"),
}
BATCH, FEATURES, HIDDEN, LAYERS = 64, 256, 1024, 4
EVAL_BATCHES, EVAL_BATCH, EVAL_GETITEM_NS = 6, 32, 1 * MS
POOL = 512


def main():
    a = truthlib.parse("hand-written PyTorch loop (CPU)", list(CONFIGS),
                       {k: v["steps"] for k, v in CONFIGS.items()})
    cfg = dict(CONFIGS[a.mode], steps=a.steps, threads=a.threads)
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data._utils.collate import default_collate
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    clock = truthlib.Clock(a.steps_log)
    truthlib.clock_dataloader_next(clock)

    class Synthetic(Dataset):
        def __init__(self, n, getitem_ns):
            g = torch.Generator().manual_seed(0)
            self.n, self.getitem_ns = n, getitem_ns
            self.x = torch.randn(POOL, FEATURES, generator=g)
            self.y = torch.randint(0, 10, (POOL,), generator=g)

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.getitem_ns and cfg.get("sleep_per_batch"):
                # One wait a batch (a shard read), on its first item, to the next multiple of
                # the batch period on the machine's clock: every worker's batch is ready at the
                # same instants, so the workers deliver in pairs whatever their start-up order.
                if i % BATCH == 0:
                    period = self.getitem_ns * BATCH
                    time.sleep((period - time.monotonic_ns() % period) / 1e9)
            elif self.getitem_ns:
                time.sleep(self.getitem_ns / 1e9)
            return self.x[i % POOL], self.y[i % POOL]

    def collate(items):
        out = default_collate(items)
        return out

    layers, width = [], FEATURES
    for _ in range(cfg.get("layers", LAYERS)):
        layers += [nn.Linear(width, cfg.get("hidden", HIDDEN)), nn.ReLU()]
        width = cfg.get("hidden", HIDDEN)
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    lossf = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train = DataLoader(Synthetic(cfg["steps"] * cfg["accum"] * BATCH, cfg.get("getitem_ns", 0)),
                       batch_size=BATCH, collate_fn=collate, num_workers=cfg.get("workers", 0))
    evald = DataLoader(Synthetic(EVAL_BATCHES * EVAL_BATCH, EVAL_GETITEM_NS), batch_size=EVAL_BATCH,
                       collate_fn=collate)
    # Warm up outside the measured run.
    xb, yb = collate([train.dataset[i] for i in range(BATCH)])
    lossf(model(xb), yb).backward()
    opt.zero_grad()
    clock.spans.clear()
    clock.first_start = None

    def evaluate():
        t0 = now()
        model.eval()
        ctx = torch.no_grad() if cfg.get("no_grad") else torch.enable_grad()
        with ctx:
            for x, y in evald:
                lossf(model(x), y).item()
        model.train()
        clock.span("evaluation", t0, now())

    backward = None
    if cfg.get("accelerate"):
        import accelerate
        accelerator = accelerate.Accelerator(cpu=True)
        model, opt, train = accelerator.prepare(model, opt, train)
        backward = accelerator.backward
    scenario = "plain_loop_" + a.mode
    truthlib.start_line(scenario, torch=torch.__version__)
    truthlib.wait_ready(a.ready)
    if cfg.get("in_memory"):
        # The same batches, built before the loop: the fix a what-if of the input wait assumes.
        it = iter([collate([train.dataset[i] for i in range(k * BATCH, (k + 1) * BATCH)])
                   for k in range(cfg["steps"] * cfg["accum"])])
    else:
        it = iter(train)
    for step in range(cfg["steps"]):
        for _ in range(cfg["accum"]):
            x, y = next(it)
            t0 = now()
            loss = lossf(model(x), y) / cfg["accum"]
            t1 = now()
            clock.span("forward", t0, t1)
            if backward:
                backward(loss)
            else:
                loss.backward()
            clock.span("backward", t1, now())
        t0 = now()
        opt.step()
        clock.span("optimizer", t0, now())
        opt.zero_grad()
        clock.step_end()
        if cfg["eval_every"] and (step + 1) % cfg["eval_every"] == 0 and step + 1 < cfg["steps"]:
            evaluate()

    truth = truthlib.build_truth(
        clock, scenario=scenario, backend="torch-cpu", config=cfg,
        expected_verdict=cfg.get("verdict", "compute_bound"),
        versions={"torch": torch.__version__}, exclude=("evaluation",),
        phase_spans={"input_wait": ["input_wait"], "forward": ["forward"], "backward": ["backward"],
                     "optimizer": ["optimizer"]},
        counts={"optimizer_steps": cfg["steps"], "micro_batches_per_step": cfg["accum"],
                "evaluations": len(clock.spans.get("evaluation", []))})
    truthlib.write_truth(a.truth, truth)
    truthlib.done_line(truth)


if __name__ == "__main__":
    main()
