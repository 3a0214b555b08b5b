#!/bin/sh
# Builds every native helper the tests use into tests/build/ (git-ignored), then runs the stand-in
# driver's self-check (tests/fakecuda/selfcheck.py; quiet unless it fails; skipped without python3).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
"$HERE/fakecuda/build.sh"
"$HERE/faketorch/build.sh"
if command -v python3 >/dev/null 2>&1; then
    out=$(python3 "$HERE/fakecuda/selfcheck.py" 2>&1) || { echo "$out" >&2; echo "tests/build.sh: FATAL: fakecuda self-check failed" >&2; exit 1; }
fi
