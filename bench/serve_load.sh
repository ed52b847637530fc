#!/usr/bin/env bash
# Load test of kiln serve (issue 15): for each --parallel value, starts `kiln serve` on a free port of 127.0.0.1 and
# runs tests/server/load.mjs with as many concurrent streams (each a prompt of PROMPT random token ids, GEN greedy
# generated tokens, ignore_eos; tests/server/load.py where node is missing), REQ_PER_STREAM requests per stream; prints a markdown table (requests/s, aggregate
# generated tokens/s, p50/p99 time to first token and inter-token latency).
#   bench/serve_load.sh [KILN] [MODEL ("" = the embedded demo model)] ["1 4 16"] [PROMPT 256] [GEN 128]
#   env: REQ_PER_STREAM (default 2), VOCAB (token ids drawn from [1, VOCAB); default 4096), EXTRA (more serve flags)
set -euo pipefail
cd "$(dirname "$0")/.."
KILN=${1:-build/release/bin/kiln}
MODEL=${2:-}
PARALLELS=${3:-"1 4 16"}
PROMPT=${4:-256}
GEN=${5:-128}
REQ_PER_STREAM=${REQ_PER_STREAM:-2}
VOCAB=${VOCAB:-4096}
m_args=()
[ -n "$MODEL" ] && m_args=(-m "$MODEL")
echo "| --parallel | streams | requests | requests/s | generated t/s | total t/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for np in $PARALLELS; do
  log=$(mktemp)
  ctx=$(( np * (PROMPT + GEN + 32) ))
  # shellcheck disable=SC2086
  "$KILN" serve "${m_args[@]}" --port 0 --parallel "$np" -c "$ctx" -b 512 --no-log ${EXTRA:-} 2>"$log" &
  pid=$!
  for _ in $(seq 1 600); do grep -q "kiln serve: ready" "$log" && break; sleep 0.1; done
  port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$log" | head -1)
  [ -n "$port" ] || { cat "$log"; kill "$pid"; exit 1; }
  if command -v node >/dev/null; then loader=(node tests/server/load.mjs); else loader=(python3 tests/server/load.py); fi
  out=$("${loader[@]}" --port "$port" --concurrency "$np" --requests $(( np * REQ_PER_STREAM )) \
          --prompt "$PROMPT" --gen "$GEN" --vocab "$VOCAB")
  kill -TERM "$pid"; wait "$pid" || true
  rm -f "$log"
  python3 -c '
import json, sys
r = json.loads(sys.argv[1])
keys = ["concurrency", "requests", "requests_per_s", "gen_tokens_per_s", "total_tokens_per_s", "ttft_ms_p50",
        "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99"]
print("| " + " | ".join([sys.argv[2]] + [str(r[k]) for k in keys]) + " |")' "$out" "$np"
done
