"""Real-framework workload: PyTorch Lightning `Trainer` fitting a small MLP on CPU, automatic
optimization (Lightning runs training_step, zero_grad and backward INSIDE
optimizer.step(closure), so forward and backward are nested in the optimizer step).

Usage: python lightning_train.py [--mode compute|input|accum|val] [--steps N] [--ready FILE]
                                 [--truth FILE] [--steps-log FILE] [--threads N]
  --mode compute: data in memory, forward + backward + optimizer dominate (COMPUTE-BOUND expected)
  --mode input:   Dataset.__getitem__ sleeps, so ~60 % of a step waits for input (INPUT-BOUND)
  --mode accum:   compute, with accumulate_grad_batches=4 (a step is 4 micro-batches)
  --mode val:     compute, with validation every 10 batches (val_check_interval) over 8 batches
                  whose __getitem__ sleeps 1 ms per item (validation is about a third of the wall
                  time; the training steps stay compute-bound)
No network. First stdout line ({"pid": ...}) once torch and Lightning are imported and the model
is built; training starts once --ready FILE exists. Truth format: tests/README.md.

Truth clocks (all from this script, CLOCK_MONOTONIC):
  input_wait  each DataLoader iterator `__next__` call that returns a batch, whole
              (truthlib.clock_dataloader_next)
  forward     the body of training_step (model call + loss)
  backward    on_before_backward -> on_after_backward
  optimizer   optimizer.step, from its step pre-hook to its post-hook, minus the closure that
              Lightning passes to it (training_step + zero_grad + backward): the update itself
  step end    on_train_batch_end after an optimizer step; a step runs from one step end to the
              next, less the validation inside it
  evaluation  on_validation_start -> on_validation_end
  residual    the rest: zero_grad, Lightning's loops and hooks
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import truthlib  # noqa: E402
from truthlib import MS, now  # noqa: E402

CONFIGS = {
    "compute": dict(steps=80, batch_size=128, features=256, hidden=1024, layers=4, getitem_ns=0,
                    verdict="compute_bound"),
    "input": dict(steps=50, batch_size=128, features=256, hidden=1024, layers=4, getitem_ns=300_000,
                  verdict="input_bound"),
    "accum": dict(steps=30, batch_size=128, features=256, hidden=1024, layers=4, getitem_ns=0,
                  verdict="compute_bound", accum=4),
    "val": dict(steps=60, batch_size=128, features=256, hidden=1024, layers=4, getitem_ns=0,
                verdict="compute_bound", val_every=10, val_batches=8, val_batch_size=32,
                val_getitem_ns=1 * MS),
}
POOL = 512  # distinct synthetic items; item i is POOL item i % POOL


def main():
    a = truthlib.parse("PyTorch Lightning MLP (CPU)", ["compute", "input", "accum", "val"],
                       {k: v["steps"] for k, v in CONFIGS.items()})
    cfg = dict(CONFIGS[a.mode], steps=a.steps, threads=a.threads)
    truthlib.offline_env()
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import torch
    import pytorch_lightning as pl
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data._utils.collate import default_collate
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    clock = truthlib.Clock(a.steps_log)

    truthlib.clock_dataloader_next(clock)

    class SyntheticDataset(Dataset):
        def __init__(self, n, getitem_ns):
            g = torch.Generator().manual_seed(0)
            self.n = n
            self.getitem_ns = getitem_ns
            self.x = torch.randn(POOL, cfg["features"], generator=g)
            self.y = torch.randint(0, 10, (POOL,), generator=g)

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.getitem_ns:
                time.sleep(self.getitem_ns / 1e9)
            return self.x[i % POOL], self.y[i % POOL]

    accum = cfg.get("accum", 1)
    dataset = SyntheticDataset(cfg["steps"] * cfg["batch_size"] * accum, cfg["getitem_ns"])

    def collate(items):
        out = default_collate(items)
        return out

    counts = {"optimizer_steps": 0, "optimizer_class": None}

    class MLP(pl.LightningModule):
        def __init__(self):
            super().__init__()
            layers, width = [], cfg["features"]
            for _ in range(cfg["layers"]):
                layers += [nn.Linear(width, cfg["hidden"]), nn.ReLU()]
                width = cfg["hidden"]
            layers.append(nn.Linear(width, 10))
            self.net = nn.Sequential(*layers)
            self.lossf = nn.CrossEntropyLoss()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            t0 = now()
            x, y = batch
            loss = self.lossf(self(x), y)
            clock.span("forward", t0, now())
            return loss

        def on_before_backward(self, loss):
            self._bwd_t0 = now()

        def on_after_backward(self):
            clock.span("backward", self._bwd_t0, now())

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            # The closure runs inside optimizer.step: time it to take it out of the optimizer phase.
            optimizer.step(closure=clock.timed("closure", optimizer_closure))

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if counts["optimizer_steps"] > len(clock.step_ends):
                clock.step_end()

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return self.lossf(self(x), y)

        def on_validation_start(self):
            self._val_t0 = now()

        def on_validation_end(self):
            clock.span("evaluation", self._val_t0, now())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    opt_t0 = [None]

    def opt_pre(opt, args, kwargs):
        opt_t0[0] = now()

    def opt_post(opt, args, kwargs):
        clock.span("optimizer_outer", opt_t0[0], now())
        counts["optimizer_steps"] += 1
        counts["optimizer_class"] = type(opt).__name__

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    register_optimizer_step_pre_hook(opt_pre)
    register_optimizer_step_post_hook(opt_post)

    model = MLP()
    loader = DataLoader(dataset, batch_size=cfg["batch_size"], num_workers=0, collate_fn=collate)
    val_every = cfg.get("val_every")
    val_loader = (DataLoader(SyntheticDataset(cfg["val_batches"] * cfg["val_batch_size"], cfg["val_getitem_ns"]),
                             batch_size=cfg["val_batch_size"], num_workers=0, collate_fn=collate)
                  if val_every else None)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=cfg["steps"], max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=cfg.get("val_batches", 0),
                         val_check_interval=val_every, accumulate_grad_batches=accum,
                         default_root_dir=os.path.join("/tmp", f"lightning-{os.getpid()}"))
    # Warm up outside the measured run (first-call allocations).
    xb, yb = collate([dataset[i] for i in range(cfg["batch_size"])])
    model.lossf(model(xb), yb).backward()
    model.zero_grad()
    clock.spans.clear()
    clock.first_start = None

    versions = {"torch": torch.__version__, "pytorch_lightning": pl.__version__}
    scenario = "lightning_" + a.mode
    truthlib.start_line(scenario, **versions)
    truthlib.wait_ready(a.ready)
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=val_loader)

    truth = truthlib.build_truth(
        clock, scenario=scenario, backend="torch-cpu+lightning", config=cfg, expected_verdict=cfg["verdict"],
        versions=versions, extra_spans=("closure",), exclude=("evaluation",),
        phase_spans={"input_wait": ["input_wait"], "forward": ["forward"], "backward": ["backward"],
                     "optimizer": ["optimizer_outer"]},
        minus={"optimizer": ["closure"]},
        counts={**counts, "backward_calls": len(clock.spans.get("backward", [])),
                "forward_calls": len(clock.spans.get("forward", [])),
                "batches_fetched": len(clock.spans.get("input_wait", [])),
                "micro_batches_per_step": accum,
                "evaluations": len(clock.spans.get("evaluation", []))})
    truthlib.write_truth(a.truth, truth)
    truthlib.done_line(truth)


if __name__ == "__main__":
    main()
