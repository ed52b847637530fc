#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs ctest (unit, backend ops, parity against the
# llama.cpp fixtures, tokenizer vectors, CLI, fuzz-corpus replay). Ends with ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build/release
ctest --output-on-failure -j"$(nproc)" "$@"
