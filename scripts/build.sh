#!/usr/bin/env bash
# Configures (release preset: build/release) and builds kiln with all cores: everything (kiln and its tests), or
# only the targets named as arguments (e.g. `scripts/build.sh kiln_cli`, what the demo needs). Says what it does
# at each step, with the seconds elapsed, and shows the build's progress (ninja's status line).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
step() { echo "kiln build [$((SECONDS - start))s]: $*" >&2; }
step "checking the Debian packages kiln needs (scripts/deps.sh)"
bash scripts/deps.sh
if [ ! -f build/release/build.ninja ]; then
  step "configuring build/release (cmake --preset release)"
  cmake --preset release >/dev/null
fi
targets=()
for t in "$@"; do targets+=(--target "$t"); done
step "building ${*:-everything (kiln and the tests)} with $(nproc) jobs in build/release"
cmake --build build/release -j"$(nproc)" "${targets[@]}"
step "build done"
