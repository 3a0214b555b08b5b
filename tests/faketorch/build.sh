#!/bin/sh
# Builds the native half of the fake torch package into tests/build/faketorch/torch/lib/:
#   libtorch_cpu.so     record_function_enter_new, record_function_exit_new (local),
#                       at::RecordFunction::end, torch::autograd::Engine::execute
#   libtorch_python.so  THPEngine_run_backward (local) + the faketorch_* ctypes entry points;
#                       NEEDED libtorch_cpu.so (RUNPATH $ORIGIN), like real torch.
# Flags match real torch's wheels: no endbr64 (-fcf-protection=none), -O2. The script fails if
# any probed function starts with a LOCK-prefixed instruction (uprobes refuse those).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${FAKETORCH_OUT:-$HERE/../build/faketorch/torch/lib}
mkdir -p "$OUT"
CC=${CC:-gcc}
FLAGS="-O2 -g -fPIC -shared -fvisibility=hidden -fcf-protection=none -Wall -Wextra -Werror"
# shellcheck disable=SC2086
$CC $FLAGS -DFT_CPU -Wl,-soname,libtorch_cpu.so -o "$OUT/libtorch_cpu.so.tmp" "$HERE/native/faketorch.c" -ldl
mv -f "$OUT/libtorch_cpu.so.tmp" "$OUT/libtorch_cpu.so"
# shellcheck disable=SC2086
$CC $FLAGS -fno-omit-frame-pointer -DFT_PYTHON -Wl,-soname,libtorch_python.so -Wl,-rpath,'$ORIGIN' -Wl,--enable-new-dtags \
    -o "$OUT/libtorch_python.so.tmp" "$HERE/native/faketorch.c" -L"$OUT" -ltorch_cpu
mv -f "$OUT/libtorch_python.so.tmp" "$OUT/libtorch_python.so"

ENTER=_ZN5torch8autograd8profiler25record_function_enter_newERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEERKSt8optionalIS7_E
EXIT=_ZN5torch8autograd8profilerL24record_function_exit_newERKN3c1013intrusive_ptrINS1_20PythonRecordFunctionENS2_6detail34intrusive_target_default_null_typeIS4_EEEE
END=_ZN2at14RecordFunction3endEv
EXEC=_ZN5torch8autograd6Engine7executeERKSt6vectorINS0_4EdgeESaIS3_EERKS2_IN2at6TensorESaIS9_EEbbbS7_
RUNBW=_ZL22THPEngine_run_backwardP7_objectS0_S0_
bad=0
check() { # lib symbol binding(GLOBAL|LOCAL)
    line=$(readelf -sW "$1" | awk -v s="$2" '$8==s && $4=="FUNC"' | head -1)
    [ -n "$line" ] || { echo "faketorch build: FATAL: $2 missing from $1" >&2; bad=1; return; }
    bind=$(echo "$line" | awk '{print $5}')
    [ "$bind" = "$3" ] || { echo "faketorch build: FATAL: $2 in $1 is $bind, expected $3" >&2; bad=1; }
    first=$(objdump -d --no-show-raw-insn "$1" --disassemble="$2" | awk -F'\t' '/^ +[0-9a-f]+:/{print $2; exit}')
    case "$first" in
        lock*|endbr*) echo "faketorch build: FATAL: $2 in $1 starts with '$first'" >&2; bad=1 ;;
    esac
}
check "$OUT/libtorch_cpu.so" $ENTER GLOBAL
check "$OUT/libtorch_cpu.so" $EXIT LOCAL
check "$OUT/libtorch_cpu.so" $END GLOBAL
check "$OUT/libtorch_cpu.so" $EXEC GLOBAL
check "$OUT/libtorch_python.so" $RUNBW LOCAL
[ "$bad" = 0 ] || exit 1
echo "faketorch: built $OUT/libtorch_cpu.so $OUT/libtorch_python.so"
