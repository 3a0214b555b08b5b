#!/usr/bin/env bash
# The prepared GPU check (issue 10 item 5): run ON the lent GPU machine from the repository root,
# with the release daemon built here by `cargo xtask gpu-check --prepare` in .gpu/ (carried).
# Builds nothing. Writes everything under $OUT (default ./gpu-out): report.txt and one
# gpu-check.tar.gz with the summaries, cards, recordings and truth files. Budget: < 8 minutes.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
W=$(mktemp -d)
D=${TRACEML_DAEMON:-$PWD/.gpu/traceml-daemon}
PY=${PYTHON:-python3}
R="$OUT/report.txt"
say() { echo "$*" | tee -a "$R"; }
say "== gpu-check $(date -u +%FT%TZ)"
say "kernel: $(uname -r)"; say "daemon: $($D --version 2>&1)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$R"
$PY -c 'import torch,sys;print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tee -a "$R"
for f in /sys/kernel/btf/vmlinux /sys/bus/event_source/devices/uprobe/type; do
  [ -e "$f" ] && say "ok: $f" || say "MISSING: $f (the daemon cannot attach here)"
done

attach() { # name, python args...
  local name=$1; shift
  local dir="$W/$name"; mkdir -p "$dir"
  $PY "$@" --ready "$dir/ready" --truth "$dir/truth.json" --steps-log "$dir/steps.log" > "$dir/target.out" 2>&1 &
  local tpid=$!
  for _ in $(seq 600); do grep -q '"pid"' "$dir/target.out" 2>/dev/null && break; sleep 0.1; done
  local t0=$(date +%s.%N)
  timeout 240 "$D" --pid "$tpid" --ready-file "$dir/ready" --output "$dir/out" --record "$dir/rec.jsonl.gz" \
    --color never > "$dir/card.txt" 2> "$dir/daemon.log"
  say "-- $name: daemon exit $? after $(echo "$(date +%s.%N) - $t0" | bc) s"
  wait "$tpid"
  grep -E "VERDICT|launches/step|step  |input_wait|gpu_wait|overhead|probe set" "$dir/card.txt" | tee -a "$R"
  # How each launch reached the driver (issue 52): per path, the libraries with their own runtime
  # copy, and the cuGetProcAddress pointers followed (none when the driver hands out its exports).
  $PY - "$dir/out/final_summary.json" <<'PY' | tee -a "$R"
import json, sys
s = json.load(open(sys.argv[1]))
dq = s["data_quality"]
print("launches_by_path", json.dumps(s["cuda"].get("launches_by_path")))
print("own_runtime_libraries", json.dumps(dq.get("own_runtime_libraries", [])))
print("driver_pointers_followed", len(dq.get("driver_pointers_followed", [])),
      json.dumps(dq.get("driver_pointers_followed", [])[:8]))
print("cuda_libraries", json.dumps(dq.get("cuda_libraries")))
PY
  cat "$dir/truth.json" >> "$R" 2>/dev/null; echo >> "$R"
}
attach cuda_input tests/gpu/cuda_loop.py --mode input --steps 150 --profile-steps 5
attach cuda_compute tests/gpu/cuda_loop.py --mode compute --steps 400 --profile-steps 5
if $PY -c 'import transformers' 2>/dev/null && grep -q -- '--device' tests/workloads/frameworks/hf_trainer.py; then
  attach hf_trainer_cuda tests/workloads/frameworks/hf_trainer.py --mode compute --device cuda --steps 200
fi

# In-process overhead: one long compute run, the daemon attached in windows 2 and 4 of 5.
dir="$W/inprocess"; mkdir -p "$dir"
$PY tests/gpu/cuda_loop.py --mode compute --steps 3000 --steps-log "$dir/steps.log" > "$dir/target.out" 2>&1 &
tpid=$!
for _ in $(seq 600); do grep -q '"pid"' "$dir/target.out" 2>/dev/null && break; sleep 0.1; done
marks=()
for w in 1 2 3 4 5; do
  marks+=("$(cat /proc/uptime | cut -d' ' -f1)")
  if [ $((w % 2)) -eq 0 ]; then timeout 60 "$D" --pid "$tpid" --duration 8 --output "$dir/on$w" --color never > /dev/null 2>&1; else sleep 8; fi
done
kill "$tpid" 2>/dev/null; wait "$tpid" 2>/dev/null
$PY - "$dir/steps.log" "${marks[@]}" <<'PY' | tee -a "$R"
import statistics, sys, time
ends = [int(l) / 1e9 for l in open(sys.argv[1]) if l.strip()]
# /proc/uptime is CLOCK_BOOTTIME; the log is CLOCK_MONOTONIC: align by their offset now.
off = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
marks = [float(m) - off for m in sys.argv[2:]] + [ends[-1] if ends else 0]
meds = []
for a, b in zip(marks, marks[1:]):
    d = [y - x for x, y in zip(ends, ends[1:]) if a + 0.5 <= x and y <= b - 0.2]
    meds.append(statistics.median(d) * 1e3 if d else float("nan"))
print("in-process windows (off,on,off,on,off) median step ms:", [round(m, 3) for m in meds])
r = [meds[1] / ((meds[0] + meds[2]) / 2), meds[3] / ((meds[2] + meds[4]) / 2)]
print("on/off ratios:", [round(x, 4) for x in r])
PY
# NCCL, 2 processes (issue 25): torchrun --nproc_per_node=2 of ddp_train.py on cuda:0 and cuda:1,
# rank 1 sleeping 20 ms per forward; the daemon on the launcher (started during rendezvous) must
# measure each rank's collective_wait and name rank 1 STRAGGLER. NCCL refuses two ranks on one
# GPU, so the step needs 2 GPUs; with fewer it is skipped, saying so.
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
TORCHRUN=${TORCHRUN:-$(dirname "$(command -v "$PY")")/torchrun}
if [ "$ngpu" -ge 2 ] && [ -x "$TORCHRUN" ]; then
  dir="$W/nccl"; mkdir -p "$dir"
  port=$($PY -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  "$TORCHRUN" --nproc_per_node=2 --master_port="$port" tests/workloads/ddp/ddp_train.py --backend nccl \
    --mode ddp --steps 600 --straggler-rank 1 --straggler-ms 20 --straggler-how sleep \
    --truth-dir "$dir" > "$dir/target.out" 2>&1 &
  tpid=$!
  sleep 1
  timeout 300 "$D" --pid "$tpid" --output "$dir/out" --color never > "$dir/card.txt" 2> "$dir/daemon.log"
  say "-- nccl: daemon exit $?"
  wait "$tpid"; say "-- nccl: torchrun exit $?"
  grep -E "VERDICT|Why|collective" "$dir/card.txt" | tee -a "$R"
  $PY - "$dir" <<'PY' | tee -a "$R"
import json, sys, os
d = sys.argv[1]
s = json.load(open(os.path.join(d, "out", "final_summary.json")))
p = s["primary_diagnosis"]
print("nccl verdict:", p["kind"], "culprit_rank", p.get("culprit_rank"), "(designed: STRAGGLER 1)")
for r in range(2):
    rs = json.load(open(os.path.join(d, "out", "rank-%d" % r, "final_summary.json")))
    t = json.load(open(os.path.join(d, "truth-rank%d.json" % r)))
    print("rank %d collective_wait median ms: daemon %s truth-est %s" % (
        r, rs["phases"]["collective_wait"].get("median_ms"),
        (t.get("median_collective_wait_est_ns") or 0) / 1e6))
PY
else
  say "-- nccl: skipped ($ngpu GPU(s); the 2-process NCCL run needs 2, and torchrun at $TORCHRUN)"
fi

tar -C "$W" -czf "$OUT/gpu-check.tar.gz" . 2>/dev/null
say "== done $(date -u +%FT%TZ); files in $OUT"
