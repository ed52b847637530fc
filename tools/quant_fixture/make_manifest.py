#!/usr/bin/env python3
"""Writes WORK_DIR/manifest.json for tests/data/models-quant in the shared fixtures' format.

  make_manifest.py GGUF_PY_DIR WORK_DIR NAME...
      from WORK_DIR/margins.json (fixture_stats.py's output) and the dequantization error (gguf-py's dequantizers,
      which are llama.cpp's) of every non-F32 tensor of each WORK_DIR/NAME.gguf against the same tensor of
      WORK_DIR/fixture-llama-f16.gguf: dequant_rel_rmse_max_by_type is the max of ||dequant - f16|| / ||f16|| per
      GGUF type over these files. nmse_vs_f16_prompt_max (the largest per-row NMSE of NAME's logits against
      fixture-llama-f16's over the prompt rows) is computed here: fixture_stats.py finds the F16 twin only of names
      ending in -q* or -bf16.
"""
import hashlib
import json
import sys
from pathlib import Path

import numpy as np


def main():
    gguf_py, work, names = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    sys.path.insert(0, gguf_py)
    import gguf
    from gguf.quants import dequantize

    margins = json.loads((work / "margins.json").read_text())
    n_vocab = 1000
    f16_logits = np.fromfile(work / "fixture-llama-f16.logits.bin", dtype=np.float32).reshape(-1, n_vocab)
    n_prompt = len((work / "prompt.txt").read_text().strip().split(","))
    src = {t.name: np.asarray(t.data, dtype=np.float32)
           for t in gguf.GGUFReader(work / "fixture-llama-f16.gguf").tensors}
    rel = {}
    models = {}
    for name in names:
        path = work / f"{name}.gguf"
        for t in gguf.GGUFReader(path).tensors:
            tn = t.tensor_type.name
            if tn == "F32":
                continue
            x = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
            ref = src[t.name].astype(np.float64).reshape(-1)
            rel[tn] = max(rel.get(tn, 0.0), float(np.linalg.norm(x - ref) / np.linalg.norm(ref)))
        m = margins[name]
        a = np.fromfile(work / f"{name}.logits.bin", dtype=np.float32).reshape(-1, n_vocab)[:n_prompt]
        ref = f16_logits[:n_prompt].astype(np.float64)
        nmse_f16 = float((((a - ref) ** 2).sum(1) / (ref ** 2).sum(1)).max())
        models[name] = {
            "arch": "llama",
            "type": name.rsplit("-", 1)[1],
            "gguf": path.name,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "decisive_rows": m["decisive_rows"],
            "free_run_checked_steps": m["free_run_checked_steps"],
            "llamacpp_self_spread_max_nmse": m["llamacpp_self_spread_max_nmse"],
            "nmse_vs_f16_prompt_max": float(f"{nmse_f16:.3g}"),
        }
    manifest = {
        "decisive_margin": 0.25,
        "dequant_rel_rmse_max_by_type": {k: float(f"{v:.3g}") for k, v in sorted(rel.items())},
        "models": models,
    }
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
