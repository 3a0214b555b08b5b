"""Counts hits of c10d functions in a running rank with gdb breakpoints (how docs/torch-hooks.md's
"Collectives" facts were found).

    DUR=3 OUT=/tmp/trace.json [SCAN=PGGloo::allreduce] gdb -p RANK_PID -batch -x gdb_trace.py
    python3 gdb_count.py /tmp/trace.json TRUTH_DIR/progress-rank<R>.log

Each hit of a function of gdb_syms.txt (SYMS=...) is logged as (CLOCK_MONOTONIC ns, label, lwp);
the breakpoints never stop the target for long (stop() returns False) but slow each hit by
~0.1 ms, so use the log for counts and order, not for durations. SCAN=<label> also reads, at that
function's entry, the at::Tensor vector in rdx (rdi is the sret slot, rsi `this`): numel at
TensorImpl+0x98, dtype (ScalarType) u16 at +0xa0, sizes from +0x40 (torch 2.15.0 layout).
"""
import gdb, os, time, json, threading, subprocess
PID = gdb.selected_inferior().pid
DUR = float(os.environ.get("DUR", "3"))
OUT = os.environ.get("OUT", "/tmp/gdb_trace.json")
SCAN = os.environ.get("SCAN", "")
LIBS = {}
for line in open("/proc/%d/maps" % PID):
    f = line.split()
    if len(f) >= 6 and f[2] == "00000000" and f[5].endswith((".so",)) and "torch/lib/" in f[5]:
        LIBS.setdefault(os.path.basename(f[5]), (int(f[0].split("-")[0], 16), f[5]))
syms = {}
def symtab(lib):
    if lib not in syms:
        out = subprocess.run(["nm", "--defined-only", LIBS[lib][1]], capture_output=True, text=True).stdout
        d = {}
        for l in out.splitlines():
            p = l.split()
            if len(p) == 3:
                d.setdefault(p[2], int(p[0], 16))
        syms[lib] = d
    return syms[lib]
WANT = [l.strip().split(None, 2) for l in open(os.environ.get("SYMS", os.path.join(os.path.dirname(os.path.abspath(__file__)), "gdb_syms.txt"))) if l.strip() and not l.startswith("#")]
log = []
class BP(gdb.Breakpoint):
    def __init__(self, label, addr):
        super().__init__("*0x%x" % addr, internal=True)
        self.label = label
    def stop(self):
        t = time.monotonic_ns()
        lwp = gdb.selected_thread().ptid[1]
        rec = [t, self.label, lwp]
        if SCAN and self.label == SCAN:
            try:
                inf = gdb.selected_inferior()
                vec = int(gdb.parse_and_eval("$rdx"))  # rdi = sret (intrusive_ptr<Work>), rsi = this
                rd = lambda a, n=8: int.from_bytes(inf.read_memory(a, n).tobytes(), "little")
                b, e = rd(vec), rd(vec + 8)
                impls = []
                for k in range((e - b) // 8):
                    impl = rd(b + 8 * k)
                    ndim = rd(impl + 0x38)
                    impls.append({"numel@0x98": rd(impl + 0x98), "dtype@0xa0": rd(impl + 0xa0, 2),
                                  "sizes": [rd(impl + 0x40 + 8 * j) for j in range(min(ndim, 5))]})
                rec.append(impls)
            except Exception as ex:
                rec.append(str(ex))
        log.append(rec)
        return False
bps = []
for lib, label, sym in WANT:
    if lib not in LIBS:
        continue
    v = symtab(lib).get(sym)
    if v is None:
        print("MISSING", lib, sym)
        continue
    bps.append(BP(label, LIBS[lib][0] + v))
def stopper():
    time.sleep(DUR)
    gdb.post_event(lambda: gdb.execute("interrupt"))
threading.Thread(target=stopper, daemon=True).start()
t0 = time.monotonic_ns()
try:
    gdb.execute("continue")
except gdb.error as ex:
    print("continue:", ex)
t1 = time.monotonic_ns()
for b in bps:
    b.delete()
json.dump({"t0": t0, "t1": t1, "log": log}, open(OUT, "w"))
print("hits", len(log))
gdb.execute("detach")
