"""Bench helper (xtask has no JSON parser): reads a truth, daemon summary or TraceML summary
file and prints `key=value` lines. Usage: python bench_json.py {truth|summary|traceml|overhead|bystander} FILE
`overhead` reads only what the in-process windows need from a daemon summary, each field optional:
verdict, steps, overhead.<number field> of `daemon_overhead`, hits.<probe> of its hits_per_step,
overhead.probe_sets (one line) and overhead.last_change_s (first probe set -> last one, seconds).
`bystander` reads a tests/workloads/bystander.py truth and FILE.marks ({"on_ns", "off_ns"}: when
the daemon was attached, when it was gone) and prints the mean work unit before, during and after
(a second of settling left out after each mark), in µs, and the units in each."""
import json
import statistics
import sys

PHASES = ("input_wait", "h2d", "forward", "backward", "optimizer", "gpu_wait", "residual")
kind, path = sys.argv[1], sys.argv[2]
d = json.load(open(path))
out = {}
if kind == "truth":
    walls = [s["wall_ns"] for s in d["steps"]]
    out["steps"] = len(walls)
    out["step_median_ms"] = statistics.median(walls) / 1e6 if walls else ""
    out["expected"] = d.get("expected_verdict", "")
    tot = sum(walls) or 1
    for p in PHASES:
        out[f"{p}_median_ms"] = d["median_phases_ns"][p] / 1e6
        out[f"{p}_share"] = sum(s["phases_ns"][p] for s in d["steps"]) / tot
elif kind == "summary":
    out["verdict"] = d["primary_diagnosis"]["kind"]
    out["steps"] = d["steps"]["count"]
    out["step_median_ms"] = d["step_ms"]["median"] if d["step_ms"]["median"] is not None else ""
    for p in PHASES:
        ph = d["phases"][p]
        out[f"{p}_median_ms"] = "" if ph["median_ms"] is None else ph["median_ms"]
        out[f"{p}_share"] = "" if ph["share"] is None else ph["share"]
    dq = d["data_quality"]
    out["events"] = dq["events_recorded"]
    out["lost_ratio"] = dq["lost_ratio"] if dq["lost_ratio"] is not None else 0
elif kind == "traceml":
    out["verdict"] = d["primary_diagnosis"]["kind"]
    st = d["step_time"]["global"]["average"]
    step = st.get("step_time_ms") or 0
    out["steps"] = d["step_time"]["global"]["window"].get("steps_analyzed") or ""
    out["step_mean_ms"] = step
    for p, k in (("input_wait", "input_wait_ms"), ("h2d", "h2d_ms"), ("forward", "forward_ms"),
                 ("backward", "backward_ms"), ("optimizer", "optimizer_ms"), ("residual", "residual_ms")):
        v = st.get(k)
        out[f"{p}_mean_ms"] = "" if v is None else v
        out[f"{p}_share"] = "" if v is None or not step else v / step
elif kind == "overhead":
    out["verdict"] = (d.get("primary_diagnosis") or {}).get("kind", "")
    out["steps"] = (d.get("steps") or {}).get("count", "")
    ov = d.get("daemon_overhead")
    out["overhead.present"] = int(ov is not None)
    for k, v in (ov or {}).items():
        if k == "hits_per_step":
            for probe, n in (v or {}).items():
                out[f"hits.{probe}"] = n
        elif k == "probe_sets":
            # [{at_s, <probe set>: bool, ..., reason}] or plain names
            sets = []
            for x in v or []:
                if isinstance(x, dict):
                    on = [n for n, b in x.items() if b is True]
                    at = x.get("at_s")
                    sets.append("%s%s%s" % ("%.1f s: " % at if isinstance(at, (int, float)) else "",
                                            "+".join(on) or "none", " (%s)" % x["reason"] if x.get("reason") else ""))
                else:
                    sets.append(str(x))
            out["overhead.probe_sets"] = "; ".join(sets)
            ats = [x["at_s"] for x in v or [] if isinstance(x, dict) and isinstance(x.get("at_s"), (int, float))]
            if len(ats) >= 2:
                # seconds from the first probe set (attach) to the last change
                out["overhead.last_change_s"] = ats[-1] - ats[0]
        elif isinstance(v, (int, float)):
            out[f"overhead.{k}"] = v
elif kind == "bystander":
    marks = json.load(open(path + ".marks"))
    on, off = marks["on_ns"], marks["off_ns"]
    settle = 1_000_000_000
    spans = {"before": (0, on), "during": (on + settle, off), "after": (off + settle, 1 << 63)}
    for name, (a, b) in spans.items():
        units = [e - s for s, e in d["units"] if a <= s and e <= b]
        out[f"{name}_units"] = len(units)
        out[f"{name}_mean_us"] = sum(units) / len(units) / 1e3 if units else ""
    # the noise floor: how far the 1 s windows before the attach spread around their mean
    wins = [w["mean_unit_ns"] for w in d["windows"] if w["t_end_ns"] <= on]
    if len(wins) >= 2:
        m = sum(wins) / len(wins)
        out["before_spread_pct"] = (max(wins) - min(wins)) / m * 100
for k, v in out.items():
    print(f"{k}={v}")
