#!/bin/sh
# Runs every fake-torch scenario (and the demo) on every pyenv CPython 3.9-3.13 and checks each
# truth file's self-consistency. Usage: tests/workloads/run_matrix.sh [OUTDIR]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-/tmp/traceml-truth}
mkdir -p "$OUT"
"$HERE/../build.sh" >/dev/null || exit 1
rc=0
for v in 3.9.18 3.10.13 3.11.7 3.12.1 3.13.0; do
    py=/root/.pyenv/versions/$v/bin/python
    for s in input_bound_single input_bound_workers h2d_bound compute_bound residual_heavy balanced demo_train \
             driver_paths_mixed driver_paths_vendor driver_paths_triton; do
        start=$(date +%s.%N)
        if ! "$py" "$HERE/$s.py" --truth "$OUT/$v-$s.json" >"$OUT/$v-$s.log" 2>&1; then
            echo "FAIL $v $s (see $OUT/$v-$s.log)"; rc=1; continue
        fi
        end=$(date +%s.%N)
        printf '%s %s %.2fs ' "$v" "$s" "$(echo "$end - $start" | bc)"
        python3 "$HERE/check_truth.py" "$OUT/$v-$s.json" >"$OUT/$v-$s.check" || rc=1
        head -3 "$OUT/$v-$s.check"
    done
done
exit $rc
