"""Per-rank table and self-checks of a ddp_train.py truth directory (truth-rank<R>.json files).

    python3 summarize.py TRUTH_DIR [--json]

Prints, per rank: steps, median step, median phases, median collective wait (measured in
allreduce mode, estimated in ddp mode) and median own work (step - collective wait); then the
job's ground-truth culprit (the rank with the largest median own work: the one the others wait
for) the share of steps in which each rank had the largest own work (persistence), and checks:
  - every step's phases add up to its wall time, steps are contiguous (end = next start);
  - completed runs have --steps steps; a hang run has status "hung" on the hang rank and
    "blocked" on the others, each with hang.step = --hang-after steps completed;
  - with a straggler: the culprit is the injected rank, the injected rank has the smallest median
    collective wait, and every other rank waits at least half the injected time more than it.
Exit status 1 if a check fails. Runs with any python3 (no torch needed).
"""
import glob
import json
import os
import statistics
import sys

MS = 1e6


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def load(d):
    ranks = {}
    for p in glob.glob(os.path.join(d, "truth-rank*.json")):
        t = json.load(open(p))
        ranks[t["rank"]] = t
    return [ranks[r] for r in sorted(ranks)]


def wait_of(step, mode):
    return step["phases_ns"]["collective_wait"] if mode == "allreduce" else step.get("collective_wait_est_ns")


def summarize(d):
    ts = load(d)
    if not ts:
        raise SystemExit("no truth-rank*.json in %s" % d)
    cfg, mode = ts[0]["config"], ts[0]["mode"]
    rows, problems = [], []
    for t in ts:
        st = t["steps"]
        for i, s in enumerate(st):
            if sum(s["phases_ns"].values()) != s["wall_ns"]:
                problems.append("rank %d step %d: phases do not add up" % (t["rank"], i))
            if i + 1 < len(st) and s["t_end_ns"] != st[i + 1]["t_start_ns"]:
                problems.append("rank %d step %d: not contiguous" % (t["rank"], i))
        ph = t["median_phases_ns"]
        rows.append({
            "rank": t["rank"], "local_rank": t["local_rank"], "pid": t["pid"], "status": t["status"],
            "steps": t["step_count"], "step_ms": (t["median_step_ns"] or 0) / MS,
            "input_ms": (ph["input_wait"] or 0) / MS, "forward_ms": (ph["forward"] or 0) / MS,
            "backward_ms": (ph["backward"] or 0) / MS, "optimizer_ms": (ph["optimizer"] or 0) / MS,
            "residual_ms": (ph["residual"] or 0) / MS,
            "collective_wait_ms": (med(wait_of(s, mode) for s in st) or 0) / MS,
            "collective_wait_measured": mode == "allreduce",
            "own_work_ms": (t["median_own_work_ns"] or 0) / MS,
            "burn_ms": (med(s["straggler_burn_ns"] for s in st) or 0) / MS,
        })
    hang_rank = cfg.get("hang_rank")
    if hang_rank is None:
        for t in ts:
            if t["status"] != "completed" or t["step_count"] != cfg["steps"]:
                problems.append("rank %d: status %s, %d steps (expected completed, %d)"
                                % (t["rank"], t["status"], t["step_count"], cfg["steps"]))
    else:
        for t in ts:
            want = "hung" if t["rank"] == hang_rank else "blocked"
            if t["status"] != want or (t["hang"] or {}).get("step") != cfg["hang_after"] \
                    or t["step_count"] != cfg["hang_after"]:
                problems.append("rank %d: status %s, hang %s, %d steps (expected %s at step %d)"
                                % (t["rank"], t["status"], t["hang"], t["step_count"], want, cfg["hang_after"]))
    out = {"dir": d, "mode": mode, "world_size": ts[0]["world_size"], "ranks": rows}
    done = [r for r in rows if r["steps"]]
    if len(done) == len(rows) and len(rows) > 1 and hang_rank is None:
        # per step (same index on every rank): which rank had the largest own work
        n = min(t["step_count"] for t in ts)
        wins = {t["rank"]: 0 for t in ts}
        for i in range(n):
            ow = {t["rank"]: t["steps"][i]["own_work_ns"] for t in ts}
            if None not in ow.values():
                wins[max(ow, key=ow.get)] += 1
        out["step_culprit_share"] = {r: w / n for r, w in wins.items()}
        culprit = max(rows, key=lambda r: r["own_work_ms"])
        out["culprit_rank"] = culprit["rank"]
        meds = sorted(r["own_work_ms"] for r in rows)
        out["own_work_spread_ms"] = meds[-1] - meds[0]
        out["own_work_spread_share"] = (meds[-1] - meds[0]) / max(r["step_ms"] for r in rows)
        sr = cfg.get("straggler_rank")
        if sr is not None and hang_rank is None:
            out["injected"] = {"rank": sr, "phase": cfg["straggler_phase"], "ms": cfg["straggler_ms"]}
            if culprit["rank"] != sr:
                problems.append("culprit by own work is rank %d, injected %d" % (culprit["rank"], sr))
            w = {r["rank"]: r["collective_wait_ms"] for r in rows}
            if min(w, key=w.get) != sr:
                problems.append("rank %d does not have the smallest collective wait: %s" % (sr, w))
            for r, v in w.items():
                if r != sr and v - w[sr] < cfg["straggler_ms"] / 2:
                    problems.append("rank %d waits only %.1f ms more than the straggler" % (r, v - w[sr]))
    out["problems"] = problems
    return out


def main():
    a = [x for x in sys.argv[1:] if not x.startswith("--")]
    res = summarize(a[0])
    if "--json" in sys.argv:
        print(json.dumps(res, indent=1))
    else:
        print("%s: mode %s, world %d%s" % (res["dir"], res["mode"], res["world_size"],
                                          ", injected %s" % res["injected"] if "injected" in res else ""))
        print("rank  pid     status     steps  step   input  fwd    bwd    coll%s  opt   resid  own   burn"
              % ("" if res["mode"] == "allreduce" else "~"))
        for r in res["ranks"]:
            print("%-5d %-7d %-10s %5d %6.1f %6.1f %6.1f %6.1f %6.1f %5.1f %6.1f %6.1f %5.1f"
                  % (r["rank"], r["pid"], r["status"], r["steps"], r["step_ms"], r["input_ms"], r["forward_ms"],
                     r["backward_ms"], r["collective_wait_ms"], r["optimizer_ms"], r["residual_ms"],
                     r["own_work_ms"], r["burn_ms"]))
        if "culprit_rank" in res:
            print("culprit (largest median own work): rank %d; own-work spread %.1f ms (%.0f %% of the step); "
                  "share of steps each rank had the largest own work: %s"
                  % (res["culprit_rank"], res["own_work_spread_ms"], 100 * res["own_work_spread_share"],
                     ", ".join("%s: %.0f %%" % (r, 100 * v) for r, v in res["step_culprit_share"].items())))
        for p in res["problems"]:
            print("PROBLEM:", p)
    sys.exit(1 if res["problems"] else 0)


if __name__ == "__main__":
    main()
