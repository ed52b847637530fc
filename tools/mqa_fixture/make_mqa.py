#!/usr/bin/env python3
"""Writes the F16 source of the MQA parity fixture (tests/data/models-mqa), and its manifest.

  make_mqa.py model GGUF_PY_DIR LLAMA_FIXTURE_GGUF OUT_DIR [shape and scale options]
      OUT_DIR/fixture-mqa-f16.gguf: llama architecture, 8 query heads sharing 1 KV head (MQA), head_dim 64, 4
      layers, n_ff 256, tied output, random weights. Vocabulary (the fixtures' 1000-token BPE) and llama3
      rope_freqs factors are copied from LLAMA_FIXTURE_GGUF (fixture-llama-f16.gguf, head_dim 64 too), the
      metadata is fixture-llama's (rms eps 1e-5, freq_base 5e5, context 2048), so ids mean the same tokens as in
      every fixture.
  make_mqa.py manifest GGUF_PY_DIR WORK_DIR NAME...
      WORK_DIR/manifest.json in the fixtures' format from WORK_DIR/margins.json (fixture_stats.py's output) and
      the dequantization error of each quantized WORK_DIR/NAME.gguf against WORK_DIR/fixture-mqa-f16.gguf.

Size. n_embd is 256 (the smallest row length the K-quants take) with attention.key_length 64, so attn_q maps 256
to 8 x 64 = 512 and attn_output back: the attention is the same as with n_embd 512, at 1.4 MB of Q4_K_M instead of
3.7 MB (`--n-embd 512 --n-ff 512`), since tests/data is kept under 15 MB.

Weight scales. The shared fixtures' make_models.py scales (embedding 0.25 when tied, blocks adding O(1) per
element) make a 4-layer model chaotic: the block outputs dominate the residual, and with n_embd 512 and n_ff 512
llama.cpp's own batched and one-token paths on the Q4_K_M file drift apart by NMSE 4.9e-3 and disagree on argmax
at margins up to 0.66 (Q4_K_M vs F16: NMSE 0.49), where the parity rule needs margins > 0.25 to be decided. Here, as in make_models_next.py, the token embedding dominates
the residual stream (std 0.7) and every block adds a moderate part (attn_output and ffn_down gains 0.5 instead of
0.7). That gives llama.cpp batch spreads (~1e-3), Q4_K_M-vs-F16 errors (~6e-2) and argmax margins like those of
the other fixtures. output_norm is small (logits std ~4.4 through the tied matrix) with random signs, since with
positive weights the tied output scores the input token itself highest on almost every row.
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

N_HEAD, N_HEAD_KV, HEAD_DIM = 8, 1, 64
N_VOCAB = 1000
SEED = 2


def cmd_model(a):
    sys.path.insert(0, a.gguf_py)
    import gguf

    src = gguf.GGUFReader(a.llama_fixture)

    def strings(key):
        f = src.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def scalar(key):
        f = src.fields[key]
        return f.parts[f.data[0]][0].item()

    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    n_embd, n_ff, n_layer = a.n_embd, a.n_ff, a.n_layer
    w = gguf.GGUFWriter(str(out / "fixture-mqa-f16.gguf"), "llama")
    w.add_name("fixture-mqa")
    w.add_description("random-weight parity fixture (not a trained model)")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_rope_dimension_count(HEAD_DIM)
    if HEAD_DIM != n_embd // N_HEAD:
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    tokens = strings("tokenizer.ggml.tokens")
    assert len(tokens) == N_VOCAB, len(tokens)
    f = src.fields["tokenizer.ggml.token_type"]
    w.add_tokenizer_model(bytes(src.fields["tokenizer.ggml.model"].parts[-1]).decode())
    w.add_tokenizer_pre(bytes(src.fields["tokenizer.ggml.pre"].parts[-1]).decode())
    w.add_token_list(tokens)
    w.add_token_types([int(f.parts[i][0]) for i in f.data])
    w.add_token_merges(strings("tokenizer.ggml.merges"))
    w.add_bos_token_id(scalar("tokenizer.ggml.bos_token_id"))
    w.add_eos_token_id(scalar("tokenizer.ggml.eos_token_id"))
    w.add_pad_token_id(scalar("tokenizer.ggml.padding_token_id"))
    w.add_add_bos_token(bool(scalar("tokenizer.ggml.add_bos_token")))

    def mat(rows, cols, gain=1.0):  # numpy [rows=out][cols=in]; GGUF ne = [in, out]
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float16)

    def norm(n, scale=1.0):
        return (scale * (1.0 + 0.1 * rng.standard_normal(n))).astype(np.float32)

    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    w.add_tensor("token_embd.weight", (a.emb * rng.standard_normal((N_VOCAB, n_embd))).astype(np.float16))
    rope = next(t for t in src.tensors if t.name == "rope_freqs.weight")
    assert rope.data.shape == (HEAD_DIM // 2,), rope.data.shape
    w.add_tensor("rope_freqs.weight", np.array(rope.data, dtype=np.float32))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(q_dim, n_embd, 1.5))
        w.add_tensor(p + "attn_k.weight", mat(kv_dim, n_embd, 1.5))
        w.add_tensor(p + "attn_v.weight", mat(kv_dim, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, q_dim, a.g_out))
        w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff, a.g_down))
    out_norm = a.out_norm or 4.4 / (a.emb * np.sqrt(n_embd))  # logit std ~4.4
    w.add_tensor("output_norm.weight", norm(n_embd, out_norm) * rng.choice([-1.0, 1.0], n_embd).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cmd_manifest(a):
    sys.path.insert(0, a.gguf_py)
    import gguf
    from gguf.quants import dequantize

    work = Path(a.work_dir)
    margins = json.loads((work / "margins.json").read_text())
    src = {t.name: np.asarray(t.data, dtype=np.float32) for t in gguf.GGUFReader(work / "fixture-mqa-f16.gguf").tensors}
    rel = {}
    models = {}
    for name in a.names:
        path = work / f"{name}.gguf"
        for t in gguf.GGUFReader(path).tensors:
            tn = t.tensor_type.name
            if tn == "F32":
                continue
            x = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
            ref = src[t.name].astype(np.float64).reshape(-1)
            rel[tn] = max(rel.get(tn, 0.0), float(np.linalg.norm(x - ref) / np.linalg.norm(ref)))
        m = margins[name]
        models[name] = {
            "arch": "llama",
            "type": name.rsplit("-", 1)[1],
            "gguf": path.name,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "decisive_rows": m["decisive_rows"],
            "free_run_checked_steps": m["free_run_checked_steps"],
            "llamacpp_self_spread_max_nmse": m["llamacpp_self_spread_max_nmse"],
            "nmse_vs_f16_prompt_max": m.get("nmse_vs_f16_prompt_max", 0.0),
        }
    manifest = {
        "decisive_margin": 0.25,
        "dequant_rel_rmse_max_by_type": {k: float(f"{v:.3g}") for k, v in sorted(rel.items())},
        "models": models,
    }
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("gguf_py")
    m.add_argument("llama_fixture")
    m.add_argument("out_dir")
    m.add_argument("--n-embd", type=int, default=256)
    m.add_argument("--n-ff", type=int, default=256)
    m.add_argument("--n-layer", type=int, default=4)
    m.add_argument("--seed", type=int, default=SEED)
    m.add_argument("--emb", type=float, default=0.7, help="token_embd std")
    m.add_argument("--g-out", type=float, default=0.5, help="attn_output gain")
    m.add_argument("--g-down", type=float, default=0.5, help="ffn_down gain")
    m.add_argument("--out-norm", type=float, default=0.0, help="output_norm magnitude (0: logit std ~4.4)")
    f = sub.add_parser("manifest")
    f.add_argument("gguf_py")
    f.add_argument("work_dir")
    f.add_argument("names", nargs="+")
    a = p.parse_args()
    cmd_model(a) if a.cmd == "model" else cmd_manifest(a)


if __name__ == "__main__":
    main()
