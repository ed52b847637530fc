#!/usr/bin/env bash
# The parity oracle: builds the CPU backend with KILN_CPU_EXACT_MATMUL=1 (every matmul the f64 dot product of the
# dequantized weights and the f32 activations: the model's exact function, no activation rounding) into
# build/exact, runs the fixtures' logits parity on it (the scalar path, whole sequence in one step) and rewrites
# tests/data/parity_exact_rows.json: per fixture, the rows where the exact model's argmax differs from llama.cpp's
# reference although the reference margin is decisive. test_model_parity does not count those rows as decisive.
#   dev/parity_exact.sh            (needs ../shared/fixtures for the full matrix; ~2 minutes of build on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/exact
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=OFF -DCMAKE_CXX_FLAGS=-DKILN_CPU_EXACT_MATMUL=1 >/dev/null
cmake --build $B --target test_model_parity >/dev/null
KILN_CPU_SIMD=scalar $B/tests/test_model_parity --gtest_filter='Fixtures/Parity.LogitsMatchLlamaCpp/cpu_*' \
  > $B/parity_exact.log 2>&1 || true
python3 - $B/parity_exact.log tests/data/parity_exact_rows.json <<'PY'
import json, re, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.search(r"(fixture-\S+) b=\d+ row (\d+): argmax (\d+) vs reference (\d+)", line) or \
        re.search(r"\[parity\] (fixture-\S+) row (\d+): not decisive .*this run (\d+), reference (\d+)", line)
    if m and m.group(3) != m.group(4):
        rows.setdefault(m.group(1), set()).add(int(m.group(2)))
out = {"how": "dev/parity_exact.sh: rows whose decisive reference argmax the exact model (f64 dots of the "
              "dequantized weights and f32 activations) contradicts, at every batch size",
       "rows": {k: sorted(v) for k, v in sorted(rows.items())}}
json.dump(out, open(sys.argv[2], "w"), indent=1)
open(sys.argv[2], "a").write("\n")
print(json.dumps(out["rows"]))
PY
