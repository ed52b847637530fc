#!/usr/bin/env bash
# Configures (release preset: build/release) and builds kiln and its tests with all cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
[ -f build/release/build.ninja ] || cmake --preset release >/dev/null
cmake --build build/release -j"$(nproc)"
