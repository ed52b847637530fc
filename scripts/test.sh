#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs ctest (unit, backend ops, parity against the
# llama.cpp fixtures, tokenizer vectors, CLI, fuzz-corpus replay). ctest marks skipped tests "***Skipped" without
# the reason; when there are any, their reasons (the GTEST_SKIP message of each) follow ctest's output, and then
# ctest's summary lines again, so the log still ends with the summary. The exit status is ctest's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build/release
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
ctest --output-on-failure -j"$(nproc)" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if grep -qE '\*\*\*Skipped|\(Skipped\)' "$log" && [ -f Testing/Temporary/LastTest.log ]; then
  echo
  echo "Skipped tests, and why:"
  # Each test's output in LastTest.log starts at "N/M Testing: NAME"; googletest writes "FILE:LINE: Skipped", the
  # message, then "[  SKIPPED ] NAME".
  awk '
    /^[0-9]+\/[0-9]+ Testing: / { name = $0; sub(/^[0-9]+\/[0-9]+ Testing: /, "", name); reason = ""; grab = 0; next }
    /: Skipped$/ { grab = 1; next }
    /^\[  SKIPPED \]/ {
      if (grab || reason != "") printf "  %s: %s\n", name, (reason == "" ? "(no reason given)" : reason)
      grab = 0; reason = ""; next
    }
    grab && NF { reason = (reason == "" ? $0 : reason " " $0) }
  ' Testing/Temporary/LastTest.log
  echo
  # ctest's summary again, last: the failed tests (if any), the pass rate, the time.
  awk '/^The following tests FAILED:/ { f = 1; print; next } f && /^\t/ { print; next } { f = 0 }' "$log"
  grep -E '^[0-9]+% tests passed' "$log" || true
  grep -E '^Total Test time' "$log" || true
fi
exit "$rc"
