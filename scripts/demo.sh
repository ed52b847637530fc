#!/usr/bin/env bash
# The demo: builds kiln if needed, then generates text with the embedded default model (no -m, offline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
exec build/release/bin/kiln run -p "${1:-And God said unto Moses,}" -n "${2:-64}" --temp 0.7 -s 42
