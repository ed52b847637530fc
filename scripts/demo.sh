#!/usr/bin/env bash
# The demo: builds the kiln binary if needed (only it: target kiln_cli, not the tests), then generates text with
# the embedded default model (no -m, offline). Progress goes to stderr from the first second (a line per step with
# the seconds elapsed, ninja's status line while compiling); stdout holds only the generated text.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh kiln_cli >&2
echo "kiln demo: kiln run -p \"${1:-And God said unto Moses,}\" -n ${2:-64} --temp 0.7 -s 42" >&2
exec build/release/bin/kiln run -p "${1:-And God said unto Moses,}" -n "${2:-64}" --temp 0.7 -s 42
