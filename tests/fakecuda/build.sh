#!/bin/sh
# Builds the stand-in CUDA runtime into tests/build/fakecuda/:
#   libcudart.so.12   SONAME libcudart.so.12, symbols versioned @@libcudart.so.12 (like PyPI's
#                     nvidia-cuda-runtime-cu12 12.x)
#   libcudart.so.13   same code, SONAME/version libcudart.so.13 (like nvidia-cuda-runtime 13.x)
#   cet/libcudart.so.12  the same library built with -fcf-protection=full: every function starts
#                     with endbr64 (what a CET-enabled distro build would look like); for tests of
#                     probe placement past endbr64. Not what the PyPI wheels look like.
#
# Flags. The real libcudart.so.12/.13 (PyPI) has no endbr64 and every exported function begins
#   push %rbp; mov %rsp,%rbp
# (frame pointers kept). We match that with -fno-omit-frame-pointer -fcf-protection=none.
# Without frame pointers gcc -O2 can make a function's first instruction `lock add ...` (an
# inlined __atomic_fetch_add), which the kernel refuses to probe (perf_event_open errno 524), so
# the script checks every exported function's first real instruction and fails loudly on LOCK.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${FAKECUDA_OUT:-$HERE/../build/fakecuda}
mkdir -p "$OUT" "$OUT/cet"
CC=${CC:-gcc}
BASE="-O2 -fno-shrink-wrap -fno-optimize-sibling-calls -mno-omit-leaf-frame-pointer -g -fPIC -shared -fvisibility=hidden -fno-omit-frame-pointer -pthread -Wall -Wextra -Werror"

build() { # $1 major, $2 output, $3 extra flags
    map=$(mktemp)
    printf 'libcudart.so.%s {\n  global:\n    cuda*;\n    __cuda*;\n    fakecuda_*;\n  local: *;\n};\n' "$1" >"$map"
    # shellcheck disable=SC2086
    $CC $BASE $3 -DFAKECUDA_VERSION=${1}080 -Wl,-soname,libcudart.so.$1 -Wl,--version-script,"$map" \
        -o "$2.tmp" "$HERE/fakecudart.c"
    rm -f "$map"
    check "$2.tmp" "$4"
    mv -f "$2.tmp" "$2"
}

# Every exported function: first instruction (after an optional endbr64) must not carry LOCK;
# $2 = "plain" requires `push %rbp` first (like the real library), "cet" requires endbr64 first.
check() {
    lib=$1; want=$2; bad=0; n=0
    for sym in $(nm -D --defined-only "$lib" | awk '$2=="T"{print $3}' | sed 's/@.*//'); do
        n=$((n + 1))
        first=$(objdump -d --no-show-raw-insn "$lib" --disassemble="$sym" | awk -F'\t' '/^ +[0-9a-f]+:/{print $2; exit}')
        second=$(objdump -d --no-show-raw-insn "$lib" --disassemble="$sym" | awk -F'\t' '/^ +[0-9a-f]+:/{c++; if(c==2){print $2; exit}}')
        real=$first
        [ "${first#endbr64}" != "$first" ] && real=$second
        case "$real" in
            lock*) echo "build.sh: FATAL: $sym in $lib starts with a LOCK-prefixed instruction ($real); uprobes cannot be placed there" >&2; bad=1 ;;
        esac
        case "$sym" in fakecuda_*) continue ;; esac # test controls: only the LOCK rule applies
        if [ "$want" = plain ] && [ "$first" != "push   %rbp" ]; then
            echo "build.sh: FATAL: $sym in $lib starts with '$first', expected 'push %rbp' like the real libcudart" >&2; bad=1
        fi
        if [ "$want" = cet ] && [ "${first#endbr64}" = "$first" ]; then
            echo "build.sh: FATAL: $sym in $lib starts with '$first', expected endbr64 in the CET build" >&2; bad=1
        fi
    done
    [ "$n" -gt 20 ] || { echo "build.sh: FATAL: only $n exported functions in $lib" >&2; exit 1; }
    [ "$bad" = 0 ] || exit 1
}

build 12 "$OUT/libcudart.so.12" "-fcf-protection=none" plain
build 13 "$OUT/libcudart.so.13" "-fcf-protection=none" plain
build 12 "$OUT/cet/libcudart.so.12" "-fcf-protection=full" cet
ln -sf libcudart.so.12 "$OUT/libcudart.so"
echo "fakecuda: built $OUT/libcudart.so.12 $OUT/libcudart.so.13 $OUT/cet/libcudart.so.12"
