"""Counts per step and one step's sequence from a gdb_trace.py log and the rank's progress log.

    python3 gdb_count.py TRACE.json TRUTH_DIR/progress-rank<R>.log
"""
import json, sys, collections
d = json.load(open(sys.argv[1]))
prog = [tuple(map(int, l.split())) for l in open(sys.argv[2])]
log = d["log"]
tids = collections.Counter(r[2] for r in log)
main = min(tids)  # training thread = pid (lowest lwp)
# steps fully inside the window
ends = [t for i, t in prog if d["t0"] <= t <= d["t1"]]
print("steps completed inside window:", len(ends) - 1)
win = (ends[0], ends[-1]) if len(ends) > 1 else (d["t0"], d["t1"])
n = max(1, len(ends) - 1)
cnt = collections.Counter()
for t, lab, lwp, *rest in log:
    if win[0] <= t < win[1]:
        cnt[(lab, "main" if lwp == main else "other:%d" % lwp)] += 1
for (lab, th), c in sorted(cnt.items(), key=lambda x: x[0]):
    print("%-40s %-14s %6d  %.2f/step" % (lab, th, c, c / n))
# one step's sequence on all threads
if len(ends) > 2:
    print("--- sequence of step between", ends[1], ends[2])
    for t, lab, lwp, *rest in log:
        if ends[1] <= t < ends[2]:
            print("%10.3f ms  %-40s %s" % ((t - ends[1]) / 1e6, lab, "main" if lwp == main else lwp))
