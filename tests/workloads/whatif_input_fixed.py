"""Ground-truth scenario whatif_input_fixed: whatif_input after its fix. The same model, loop and
batches, but the samples are ready (__getitem__ takes 0.2 ms instead of 15 ms, as if decoded once
and cached): its measured step is what whatif_input's what-if must predict.
See tests/README.md; usage: python whatif_input_fixed.py [--ready FILE] [--truth FILE] [--steps N]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groundtruth  # noqa: E402

CONFIG = dict(
    steps=60,
    batch_size=2,
    getitem_ns=200000,
    layer_cpu_ns=3000000,
    bwd_cpu_ns=4000000,
    opt_cpu_ns=5000000,
    # The loader's own work (2 items of 0.2 ms, collate) is ~4 % of a ~19 ms step of host work
    # in forward, backward and the optimizer.
    verdict='gpu_bound',
)

if __name__ == "__main__":
    groundtruth.run("whatif_input_fixed", CONFIG)
