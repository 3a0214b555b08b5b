#!/bin/sh
# Builds the stand-in CUDA driver, runtime, vendor library and Triton-shape launcher into
# tests/build/fakecuda/:
#   libcuda.so.1      the stand-in DRIVER (fakecuda_driver.c): owns the simulated device; exports the
#                     cu* entry points with the real signatures, cuGetProcAddress(_v2), and the
#                     fakecuda_* test controls. No symbol versioning (like the real libcuda.so.1).
#   libcudart.so.12   SONAME libcudart.so.12, symbols versioned @@libcudart.so.12 (like PyPI's
#                     nvidia-cuda-runtime-cu12 12.x)
#   libcudart.so.13   same code, SONAME/version libcudart.so.13 (like nvidia-cuda-runtime 13.x)
#                     The runtimes load the driver at first use (dlopen libcuda.so.1, RUNPATH
#                     $ORIGIN, fallback: this build's libcuda.so.1 by absolute path) and take every
#                     driver entry point through cuGetProcAddress_v2: no DT_NEEDED, no cu* import.
#   libfakeblasLt.so.13  stand-in vendor library with its own runtime copy (fakeblas.c), the shape
#                     of cuBLAS/cuDNN/NCCL on PyPI: dlopen + cuGetProcAddress, imports no cu*.
#   libfaketriton_launcher.so  the Triton shape (faketriton.c): dlsym(cuLaunchKernelEx/cuLaunchKernel).
#   cet/libcudart.so.12  the same library built with -fcf-protection=full: every function starts
#                     with endbr64 (what a CET-enabled distro build would look like); for tests of
#                     probe placement past endbr64. Not what the PyPI wheels look like.
#   libnvidia-ml.so.1 the stand-in NVML (fakenvml.c), SONAME libnvidia-ml.so.1 (+ libnvidia-ml.so):
#                     answers from the driver's per-process records. Compiled against NVIDIA's own
#                     nvml.h, from $NVML_INCLUDE_DIR, else the cache
#                     ${XDG_CACHE_HOME:-$HOME/.cache}/traceml/nvml-dev/, else fetched there from
#                     PyPI (nvidia-nvml-dev-cu12, pinned version and checksum) with pip.
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
OUT=$(cd "$OUT" && pwd)
DRV_FALLBACK="-DFAKECUDA_DRIVER_FALLBACK=\"$OUT/libcuda.so.1\""
CC=${CC:-gcc}
BASE="-O2 -fno-shrink-wrap -fno-optimize-sibling-calls -mno-omit-leaf-frame-pointer -g -fPIC -shared -fvisibility=hidden -fno-omit-frame-pointer -pthread -Wall -Wextra -Werror"

build() { # $1 major, $2 output, $3 extra flags
    map=$(mktemp)
    printf 'libcudart.so.%s {\n  global:\n    cuda*;\n    __cuda*;\n    fakecuda_*;\n  local: *;\n};\n' "$1" >"$map"
    # shellcheck disable=SC2086
    $CC $BASE $3 -DFAKECUDA_VERSION=${1}080 "$DRV_FALLBACK" -Wl,-soname,libcudart.so.$1 -Wl,--version-script,"$map" \
        -Wl,-rpath,"$5" -Wl,--enable-new-dtags -o "$2.tmp" "$HERE/fakecudart.c" -ldl
    rm -f "$map"
    check "$2.tmp" "$4" 20
    no_cuda_link "$2.tmp"
    mv -f "$2.tmp" "$2"
}

# A library that must reach the driver only through dlopen/dlsym/cuGetProcAddress: no DT_NEEDED on
# libcuda/libcudart and no undefined cu*/cuda* symbol.
no_cuda_link() {
    if readelf -d "$1" | grep NEEDED | grep -Eq 'libcuda|libcudart'; then
        echo "build.sh: FATAL: $1 has DT_NEEDED on libcuda/libcudart" >&2; exit 1
    fi
    if nm -D --undefined-only "$1" | awk '{print $NF}' | grep -Eq '^_*cu'; then
        echo "build.sh: FATAL: $1 imports a cu*/cuda* symbol" >&2; exit 1
    fi
}

# The driver's internal implementations (fcd_*, local): what cuGetProcAddress hands out with
# FAKECUDA_PROCADDR=internal. Each must start with push %rbp and carry no LOCK first.
check_internal() {
    lib=$1; bad=0; n=0
    for sym in $(nm "$lib" | awk '$2=="t" && $3 ~ /^fcd_cu/ {print $3}'); do
        n=$((n + 1))
        first=$(objdump -d --no-show-raw-insn "$lib" --disassemble="$sym" | awk -F'\t' '/^ +[0-9a-f]+:/{print $2; exit}')
        if [ "$first" != "push   %rbp" ]; then
            echo "build.sh: FATAL: internal $sym in $lib starts with '$first', expected 'push %rbp'" >&2; bad=1
        fi
    done
    [ "$n" -gt 40 ] || { echo "build.sh: FATAL: only $n internal fcd_cu* functions in $lib" >&2; exit 1; }
    [ "$bad" = 0 ] || exit 1
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
        case "$sym" in fakecuda_*|fakeblas_stats|faketriton_stats) continue ;; esac # test controls: only the LOCK rule applies
        if [ "$want" = plain ] && [ "$first" != "push   %rbp" ]; then
            echo "build.sh: FATAL: $sym in $lib starts with '$first', expected 'push %rbp' like the real libcudart" >&2; bad=1
        fi
        if [ "$want" = cet ] && [ "${first#endbr64}" = "$first" ]; then
            echo "build.sh: FATAL: $sym in $lib starts with '$first', expected endbr64 in the CET build" >&2; bad=1
        fi
    done
    [ "$n" -gt "$3" ] || { echo "build.sh: FATAL: only $n exported functions in $lib" >&2; exit 1; }
    [ "$bad" = 0 ] || exit 1
}

# the driver
# shellcheck disable=SC2086
$CC $BASE -fcf-protection=none -Wl,-soname,libcuda.so.1 -o "$OUT/libcuda.so.1.tmp" "$HERE/fakecuda_driver.c"
check "$OUT/libcuda.so.1.tmp" plain 40
check_internal "$OUT/libcuda.so.1.tmp"
mv -f "$OUT/libcuda.so.1.tmp" "$OUT/libcuda.so.1"

build 12 "$OUT/libcudart.so.12" "-fcf-protection=none" plain '$ORIGIN'
build 13 "$OUT/libcudart.so.13" "-fcf-protection=none" plain '$ORIGIN'
build 12 "$OUT/cet/libcudart.so.12" "-fcf-protection=full" cet '$ORIGIN/..'
ln -sf libcudart.so.12 "$OUT/libcudart.so"

# the vendor library and the Triton-shape launcher
# shellcheck disable=SC2086
$CC $BASE -fcf-protection=none "$DRV_FALLBACK" -Wl,-soname,libfakeblasLt.so.13 -Wl,-rpath,'$ORIGIN' -Wl,--enable-new-dtags \
    -o "$OUT/libfakeblasLt.so.13.tmp" "$HERE/fakeblas.c" -ldl
check "$OUT/libfakeblasLt.so.13.tmp" plain 4
no_cuda_link "$OUT/libfakeblasLt.so.13.tmp"
for s in libcuda.so.1 cuGetProcAddress; do
    strings -n 8 "$OUT/libfakeblasLt.so.13.tmp" | grep -q "^$s" || { echo "build.sh: FATAL: no \"$s\" string in libfakeblasLt" >&2; exit 1; }
done
mv -f "$OUT/libfakeblasLt.so.13.tmp" "$OUT/libfakeblasLt.so.13"
# shellcheck disable=SC2086
$CC $BASE -fcf-protection=none "$DRV_FALLBACK" -Wl,-soname,libfaketriton_launcher.so -Wl,-rpath,'$ORIGIN' -Wl,--enable-new-dtags \
    -o "$OUT/libfaketriton_launcher.so.tmp" "$HERE/faketriton.c" -ldl
check "$OUT/libfaketriton_launcher.so.tmp" plain 2
no_cuda_link "$OUT/libfaketriton_launcher.so.tmp"
mv -f "$OUT/libfaketriton_launcher.so.tmp" "$OUT/libfaketriton_launcher.so"

# NVIDIA's nvml.h: the stand-in NVML is compiled against it, so every exported function has the
# real prototype and name. The header is in PyPI's nvidia-nvml-dev-cu12 wheel (no GPU, no CUDA
# toolkit needed); a fetched copy is checked against the pinned checksum.
NVML_DEV_VERSION=12.9.79
NVML_H_SHA256=5a9ed049520b02354b74280f3a1e83b27292cf9f7958beb227461c0bc8676b99
nvml_include() {
    if [ -n "${NVML_INCLUDE_DIR:-}" ]; then
        [ -f "$NVML_INCLUDE_DIR/nvml.h" ] || { echo "build.sh: FATAL: NVML_INCLUDE_DIR=$NVML_INCLUDE_DIR has no nvml.h" >&2; exit 1; }
        echo "$NVML_INCLUDE_DIR"; return
    fi
    cache=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/traceml/nvml-dev
    if [ -f "$cache/nvml.h" ]; then echo "$cache"; return; fi
    mkdir -p "$cache"
    tmp=$(mktemp -d)
    if ! python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        "nvidia-nvml-dev-cu12==$NVML_DEV_VERSION" -d "$tmp" >"$tmp/pip.log" 2>&1; then
        cat "$tmp/pip.log" >&2; rm -rf "$tmp"
        echo "build.sh: FATAL: cannot get NVIDIA's nvml.h for the stand-in NVML: no \$NVML_INCLUDE_DIR, nothing in $cache, and 'python3 -m pip download nvidia-nvml-dev-cu12==$NVML_DEV_VERSION' failed (no PyPI?). Put nvml.h in $cache or point NVML_INCLUDE_DIR at a directory holding it." >&2
        exit 1
    fi
    python3 - "$tmp" "$cache/nvml.h.tmp" <<'PY' || { rm -rf "$tmp"; exit 1; }
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")
if len(whl) != 1:
    sys.exit(f"build.sh: FATAL: expected one nvidia-nvml-dev-cu12 wheel, got {whl}")
with zipfile.ZipFile(whl[0]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("nvidia/nvml_dev/include/nvml.h"))
PY
    rm -rf "$tmp"
    sum=$(sha256sum "$cache/nvml.h.tmp" | awk '{print $1}')
    if [ "$sum" != "$NVML_H_SHA256" ]; then
        rm -f "$cache/nvml.h.tmp"
        echo "build.sh: FATAL: nvml.h from nvidia-nvml-dev-cu12==$NVML_DEV_VERSION has sha256 $sum, expected $NVML_H_SHA256" >&2; exit 1
    fi
    mv -f "$cache/nvml.h.tmp" "$cache/nvml.h"
    echo "$cache"
}
NVML_INC=$(nvml_include)
# -Wmissing-prototypes: a function nvml.h does not declare (a misspelt name) is an error.
# shellcheck disable=SC2086
$CC $BASE -fcf-protection=none -Wmissing-prototypes -I"$NVML_INC" -I"$HERE" -Wl,-soname,libnvidia-ml.so.1 \
    -o "$OUT/libnvidia-ml.so.1.tmp" "$HERE/fakenvml.c"
if readelf -d "$OUT/libnvidia-ml.so.1.tmp" | grep NEEDED | grep -Eq 'libcuda|libcudart'; then
    echo "build.sh: FATAL: libnvidia-ml.so.1 has DT_NEEDED on libcuda/libcudart" >&2; exit 1
fi
mv -f "$OUT/libnvidia-ml.so.1.tmp" "$OUT/libnvidia-ml.so.1"
ln -sf libnvidia-ml.so.1 "$OUT/libnvidia-ml.so"
echo "fakecuda: built $OUT/libcuda.so.1 $OUT/libcudart.so.12 $OUT/libcudart.so.13 $OUT/cet/libcudart.so.12 $OUT/libfakeblasLt.so.13 $OUT/libfaketriton_launcher.so $OUT/libnvidia-ml.so.1"
