"""Self-consistency check of a truth file: python check_truth.py TRUTH.json [...]
Checks: steps are contiguous (t_end of one = t_start of the next); per step the phases sum to the
wall time exactly and none is negative; unaccounted time (residual minus zero_grad and the
deliberate sleep) is small; the dominant phase matches the expected verdict; counters add up."""
import json
import sys

VERDICT_PHASE = {"input_bound": "input_wait", "h2d_bound": "h2d", "gpu_bound": "gpu_wait",
                 "residual_heavy": "residual", "balanced": None}


def check(path):
    t = json.load(open(path))
    errs = []
    steps = t["steps"]
    if t["step_count"] != len(steps) or len(steps) != t["config"]["steps"]:
        errs.append(f"step count {len(steps)} != configured {t['config']['steps']}")
    for a, b in zip(steps, steps[1:]):
        if a["t_end_ns"] != b["t_start_ns"]:
            errs.append(f"step {a['index']} not contiguous")
    fn = t.get("final_next")
    if steps and fn and steps[-1]["t_end_ns"] != fn["t_start_ns"]:
        errs.append("last step does not end where the final next() starts")
    worst_unacc = 0
    for s in steps:
        ph = s["phases_ns"]
        if sum(ph.values()) != s["wall_ns"] or s["t_end_ns"] - s["t_start_ns"] != s["wall_ns"]:
            errs.append(f"step {s['index']}: phases do not sum to wall")
        if any(v < 0 for v in ph.values()):
            errs.append(f"step {s['index']}: negative phase {ph}")
        worst_unacc = max(worst_unacc, s.get("unaccounted_ns", 0))
    if worst_unacc > 3_000_000:
        errs.append(f"unaccounted time up to {worst_unacc / 1e6:.2f} ms in a step")
    total = sum(s["wall_ns"] for s in steps)
    if total != t["totals"]["wall_ns"] or sum(t["totals"][f"{p}_ns"] for p in
                                              ("input_wait", "h2d", "forward", "backward", "optimizer",
                                               "gpu_wait", "residual")) != total:
        errs.append("totals inconsistent")
    span = steps[-1]["t_end_ns"] - steps[0]["t_start_ns"] if steps else 0
    if span != total:
        errs.append("steps do not cover the loop span")
    want = VERDICT_PHASE.get(t.get("expected_verdict"))
    med = t.get("median_phases_ns", {})
    if want and t.get("dominant_phase") != want:
        errs.append(f"dominant phase {t.get('dominant_phase')} != {want}")
    if t.get("expected_verdict") == "balanced" and med:
        if max(med.values()) > 0.5 * sum(med.values()):
            errs.append(f"balanced scenario has a phase above 50%: {med}")
    for s in steps:
        by = s.get("launches_by_path")
        if by is not None and sum(by.values()) != s.get("launches"):
            errs.append(f"step {s['index']}: launches_by_path {by} does not sum to launches {s.get('launches')}")
    path = t.get("config", {}).get("launch_path")
    if steps and path and all("launches_by_path" in s for s in steps):
        tot = {k: sum(s["launches_by_path"][k] for s in steps) for k in ("runtime", "library", "direct")}
        want = {"runtime": ("runtime",), "vendor": ("library",), "triton": ("direct",),
                "mixed": ("runtime", "library", "direct")}.get(path, ())
        for k in want:
            if not tot[k]:
                errs.append(f"launch_path {path}: no {k} launches")
        if path in ("vendor", "triton") and tot["runtime"]:
            errs.append(f"launch_path {path}: {tot['runtime']} launches went through the runtime")
    cs = t.get("cuda_stats")
    if cs and "launches_driver" in cs and cs["launches_driver"] != (
            cs["launches_runtime"] + cs["launches_library"] + cs["launches_direct"]):
        errs.append("cuda_stats: the driver's launches_driver != runtime + library + direct")
    if cs and cs.get("bytes_h2d", 0) < t["totals"].get("bytes_h2d", 0):
        errs.append("cuda_stats bytes_h2d below the per-step sum")
    return errs, worst_unacc


if __name__ == "__main__":
    bad = 0
    for p in sys.argv[1:]:
        errs, u = check(p)
        print(f"{'OK  ' if not errs else 'FAIL'} {p} (max unaccounted {u / 1e6:.2f} ms)" + "".join(f"\n  {e}" for e in errs))
        bad |= bool(errs)
    sys.exit(1 if bad else 0)
