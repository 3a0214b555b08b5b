#!/bin/sh
# Builds every native helper the tests use into tests/build/ (git-ignored).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
"$HERE/fakecuda/build.sh"
"$HERE/faketorch/build.sh"
