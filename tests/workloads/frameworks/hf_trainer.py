"""Real-framework workload: Hugging Face `Trainer` fine-tuning a tiny BERT classifier on CPU.

Usage: python hf_trainer.py [--mode compute|input|input_iterable|accum|eval] [--steps N] [--ready FILE]
                            [--truth FILE] [--steps-log FILE] [--threads N]
  --mode compute: data in memory, forward + backward + optimizer dominate (COMPUTE-BOUND expected)
  --mode input:   Dataset.__getitem__ sleeps, so ~60 % of a step waits for input (INPUT-BOUND)
  --mode input_iterable: the same data as a Hugging Face `datasets` IterableDataset (one shard,
                  `to_iterable_dataset`) whose `.map()` "tokenizer" sleeps 10 ms an example, as a
                  streaming dataset's preprocessing does (INPUT-BOUND)
  --mode accum:   compute, with gradient_accumulation_steps=4 (a step is 4 micro-batches)
  --mode eval:    compute, with eval_strategy="steps" every 10 steps over 64 evaluation samples
                  whose __getitem__ sleeps 5 ms (evaluation is about half the wall time; the
                  training steps stay compute-bound)
No network and no downloads: the model is built from a BertConfig, the data is synthetic. The
first stdout line ({"pid": ...}) goes out once torch and transformers are imported and the model
is built; training starts once --ready FILE exists. Truth format: tests/README.md.

Truth clocks (all from this script, CLOCK_MONOTONIC):
  input_wait  each DataLoader iterator `__next__` call that returns a batch, whole
              (truthlib.clock_dataloader_next)
  forward     Trainer.compute_loss (model(**inputs), loss computed by the model)
  backward    accelerator.backward(loss)
  optimizer   optimizer.step, from its step pre-hook to its post-hook
  step end    TrainerCallback.on_step_end (optimizer steps only); a step runs from one step end
              to the next, less the evaluation inside it
  evaluation  Trainer.evaluate, start to return (its fetches and forwards are not the steps')
  residual    the rest: the gradient norm (transformers 5.24 computes it every step, even with
              clipping off: max_grad_norm=0 here), lr scheduler, zero_grad, the Trainer's
              bookkeeping; ~3 ms a step. The model is narrow (hidden 128, vocab 1000) with long
              sequences (96) so that compute, which grows with tokens, dominates what grows with
              the parameter count (norm, zero_grad, optimizer)
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import truthlib  # noqa: E402
from truthlib import MS, now  # noqa: E402

CONFIGS = {
    # seq_len tokens per item, getitem_ns sleep per item, expected verdict
    "compute": dict(steps=60, batch_size=8, seq_len=96, hidden=128, layers=2, heads=2, intermediate=512,
                    vocab=1000, getitem_ns=0, max_grad_norm=0.0, verdict="compute_bound"),
    "input": dict(steps=40, batch_size=8, seq_len=96, hidden=128, layers=2, heads=2, intermediate=512,
                  vocab=1000, getitem_ns=10 * MS, max_grad_norm=0.0, verdict="input_bound"),
    "input_iterable": dict(steps=40, batch_size=8, seq_len=96, hidden=128, layers=2, heads=2,
                           intermediate=512, vocab=1000, getitem_ns=10 * MS, max_grad_norm=0.0,
                           verdict="input_bound", iterable=True),
    "accum": dict(steps=40, batch_size=8, seq_len=96, hidden=128, layers=2, heads=2, intermediate=512,
                  vocab=1000, getitem_ns=0, max_grad_norm=0.0, verdict="compute_bound", accum=4),
    "eval": dict(steps=60, batch_size=8, seq_len=96, hidden=128, layers=2, heads=2, intermediate=512,
                 vocab=1000, getitem_ns=0, max_grad_norm=0.0, verdict="compute_bound", eval_steps=10,
                 eval_samples=64, eval_getitem_ns=5 * MS),
}
POOL = 64  # distinct synthetic items; item i is POOL item i % POOL (long runs need no memory)


def main():
    a = truthlib.parse("HF Trainer on a tiny BERT (CPU)", list(CONFIGS),
                       {k: v["steps"] for k, v in CONFIGS.items()})
    cfg = dict(CONFIGS[a.mode], steps=a.steps, threads=a.threads)
    truthlib.offline_env()
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import transformers
    import accelerate
    from torch.utils.data import Dataset
    from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,
                              TrainingArguments, default_data_collator)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    clock = truthlib.Clock(a.steps_log)

    truthlib.clock_dataloader_next(clock)

    class SyntheticDataset(Dataset):
        """In-memory token ids."""

        def __init__(self, n, getitem_ns):
            g = torch.Generator().manual_seed(0)
            self.n = n
            self.getitem_ns = getitem_ns
            self.ids = torch.randint(1, cfg["vocab"], (POOL, cfg["seq_len"]), generator=g)
            self.labels = torch.randint(0, 2, (POOL,), generator=g)

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.getitem_ns:
                time.sleep(self.getitem_ns / 1e9)
            j = i % POOL
            return {"input_ids": self.ids[j], "attention_mask": torch.ones(cfg["seq_len"], dtype=torch.long),
                    "labels": self.labels[j]}

    accum = cfg.get("accum", 1)
    dataset = SyntheticDataset(cfg["steps"] * cfg["batch_size"] * accum, cfg["getitem_ns"])
    if cfg.get("iterable"):
        import datasets
        base = SyntheticDataset(cfg["steps"] * cfg["batch_size"] * accum, 0)
        rows = [base[i] for i in range(len(base))]
        table = datasets.Dataset.from_dict(
            {k: [r[k].tolist() for r in rows] for k in ("input_ids", "attention_mask", "labels")})

        def tokenize(example):
            time.sleep(cfg["getitem_ns"] / 1e9)
            return example

        dataset = table.to_iterable_dataset(num_shards=1).map(tokenize).with_format("torch")
    eval_dataset = (SyntheticDataset(cfg["eval_samples"], cfg["eval_getitem_ns"])
                    if cfg.get("eval_steps") else None)

    def collate(features):
        out = default_data_collator(features)
        return out

    model = BertForSequenceClassification(BertConfig(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"],
        num_attention_heads=cfg["heads"], intermediate_size=cfg["intermediate"],
        max_position_embeddings=cfg["seq_len"], num_labels=2))

    class TimedTrainer(Trainer):
        def compute_loss(self, *args, **kwargs):
            t0 = now()
            try:
                return super().compute_loss(*args, **kwargs)
            finally:
                clock.span("forward", t0, now())

        # Parts of the residual, reported per step (clip_grad_ns, flos_ns).
        def _clip_grad_norm(self, *args, **kwargs):
            return clock.timed("clip_grad", super()._clip_grad_norm)(*args, **kwargs)

        def floating_point_ops(self, *args, **kwargs):
            return clock.timed("flos", super().floating_point_ops)(*args, **kwargs)

        def evaluate(self, *args, **kwargs):
            return clock.timed("evaluation", super().evaluate)(*args, **kwargs)

        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            self.accelerator.backward = clock.timed("backward", self.accelerator.backward)

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            clock.step_end()

    opt_state = {"t0": None, "steps": 0, "class": None}

    def opt_pre(opt, args, kwargs):
        opt_state["t0"] = now()

    def opt_post(opt, args, kwargs):
        clock.span("optimizer", opt_state["t0"], now())
        opt_state["steps"] += 1
        opt_state["class"] = type(opt).__name__

    # Global hooks: the Trainer creates its optimizer inside train(); these run inside torch's
    # `Optimizer.step#<cls>.step` record_function, around the step itself.
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    register_optimizer_step_pre_hook(opt_pre)
    register_optimizer_step_post_hook(opt_post)

    targs = TrainingArguments(
        output_dir=os.path.join("/tmp", f"hf-trainer-{os.getpid()}"), max_steps=cfg["steps"],
        per_device_train_batch_size=cfg["batch_size"], learning_rate=5e-5, use_cpu=True,
        report_to="none", logging_strategy="no", save_strategy="no",
        eval_strategy="steps" if eval_dataset else "no", eval_steps=cfg.get("eval_steps"),
        per_device_eval_batch_size=cfg["batch_size"], prediction_loss_only=True,
        gradient_accumulation_steps=accum,
        disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False, seed=0,
        max_grad_norm=cfg["max_grad_norm"])
    trainer = TimedTrainer(model=model, args=targs, train_dataset=dataset, eval_dataset=eval_dataset,
                           data_collator=collate, callbacks=[StepClock()])
    model.zero_grad = clock.timed("zero_grad", model.zero_grad)
    # Warm up outside the measured run (first-call allocations, lazy init of the kernels).
    warm = collate([SyntheticDataset(cfg["batch_size"], 0)[i] for i in range(cfg["batch_size"])])
    model(**warm).loss.backward()
    model.zero_grad()
    clock.spans.clear()
    clock.first_start = None

    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "accelerate": accelerate.__version__}
    if cfg.get("iterable"):
        import datasets
        versions["datasets"] = datasets.__version__
    scenario = "hf_trainer_" + a.mode
    truthlib.start_line(scenario, **versions)
    truthlib.wait_ready(a.ready)
    trainer.train()

    truth = truthlib.build_truth(
        clock, scenario=scenario, backend="torch-cpu+transformers", config=cfg,
        expected_verdict=cfg["verdict"], versions=versions, extra_spans=("clip_grad", "flos", "zero_grad"),
        exclude=("evaluation",),
        phase_spans={"input_wait": ["input_wait"], "forward": ["forward"], "backward": ["backward"],
                     "optimizer": ["optimizer"]},
        counts={"optimizer_steps": opt_state["steps"], "optimizer_class": opt_state["class"],
                "backward_calls": len(clock.spans.get("backward", [])),
                "forward_calls": len(clock.spans.get("forward", [])),
                "batches_fetched": len(clock.spans.get("input_wait", [])),
                "micro_batches_per_step": accum,
                "evaluations": len(clock.spans.get("evaluation", []))})
    truthlib.write_truth(a.truth, truth)
    truthlib.done_line(truth)


if __name__ == "__main__":
    main()
