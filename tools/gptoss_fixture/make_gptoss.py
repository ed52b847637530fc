#!/usr/bin/env python3
"""Writes the F16 source of the gpt-oss parity fixtures (tests/data/models-gptoss), and their manifest.

  make_gptoss.py model GGUF_PY_DIR LLAMA_FIXTURE_GGUF OUT_DIR
      OUT_DIR/fixture-gptoss-f16.gguf: general.architecture "gpt-oss" (llama.cpp's LLM_ARCH_OPENAI_MOE), random
      weights, every feature of the architecture present and large enough to move the logits:
        - 2 layers: layer 0 sliding-window (attention.sliding_window 16, so the window matters from row 16 of the
          64-row sequence), layer 1 full (the pattern of 2 is implicit, as in real files: even layers are local);
        - 4 heads / 2 KV heads, head_dim 64 (attention.key_length), q/k/v and attn_output biases;
        - attention sinks (blk.N.attn_sinks.weight [n_head], one learned logit per head in each softmax's
          denominator), scale 1/sqrt(head_dim), no q/k norm;
        - NeoX RoPE with YaRN (rope.scaling.type yarn, factor 32, original_context_length 4096, freq_base 150000,
          as gpt-oss-20b ships): interpolated low frequencies and cos/sin times 1 + 0.1 ln 32;
        - blk.N.post_attention_norm.weight as the FFN's pre-norm;
        - mixture of experts: 4 experts, top 2 by router logit (ffn_gate_inp with bias), softmax over the 2 chosen
          logits, experts with gate/up/down biases and the clamped SwiGLU x sigmoid(1.702 x) (y + 1), x clamped
          above at 7 and y to [-7, 7] (the gate/up gain 4 makes the clamps bite);
        - untied output.
      The vocabulary is copied from LLAMA_FIXTURE_GGUF (the fixtures' 1000-token BPE), so ids mean the same tokens
      as in every fixture. n_embd 128 keeps the F16 file under 1.5 MB.
  make_gptoss.py manifest GGUF_PY_DIR WORK_DIR NAME...
      WORK_DIR/manifest.json in the fixtures' format from WORK_DIR/margins.json (fixture_stats.py's output), the
      dequantization error of each WORK_DIR/NAME.gguf against WORK_DIR/fixture-gptoss-f16.gguf and its logits'
      NMSE against the F16 logits over the prompt rows.
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

N_VOCAB = 1000
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 128, 2, 4, 2, 64
N_EXPERT, N_USED, N_FF_EXP = 4, 2, 64
SEED = 29


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
    w = gguf.GGUFWriter(str(out / "fixture-gptoss-f16.gguf"), "gpt-oss")
    w.add_name("fixture-gptoss")
    w.add_description("random-weight parity fixture (not a trained model)")
    w.add_context_length(131072)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF_EXP)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_USED)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(150000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_sliding_window(a.window)
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

    def exps(rows, cols, gain=1.0):  # numpy [expert][out][in]; GGUF ne = [in, out, expert]
        return (rng.standard_normal((N_EXPERT, rows, cols)) * gain / np.sqrt(cols)).astype(np.float16)

    def vec(shape, std, mean=0.0):
        return (mean + std * rng.standard_normal(shape)).astype(np.float32)

    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    w.add_tensor("token_embd.weight", (a.emb * rng.standard_normal((N_VOCAB, N_EMBD))).astype(np.float16))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", vec(N_EMBD, 0.1, 1.0))
        w.add_tensor(p + "attn_q.weight", mat(q_dim, N_EMBD, 1.5))
        w.add_tensor(p + "attn_q.bias", vec(q_dim, 0.5))
        w.add_tensor(p + "attn_k.weight", mat(kv_dim, N_EMBD, 1.5))
        w.add_tensor(p + "attn_k.bias", vec(kv_dim, 0.5))
        w.add_tensor(p + "attn_v.weight", mat(kv_dim, N_EMBD))
        w.add_tensor(p + "attn_v.bias", vec(kv_dim, 0.5))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, q_dim, a.g_out))
        w.add_tensor(p + "attn_output.bias", vec(N_EMBD, 0.2))
        w.add_tensor(p + "attn_sinks.weight", vec(N_HEAD, 1.0, 1.0))
        w.add_tensor(p + "post_attention_norm.weight", vec(N_EMBD, 0.1, 1.0))
        w.add_tensor(p + "ffn_gate_inp.weight", mat(N_EXPERT, N_EMBD, a.router_gain).astype(np.float32))
        w.add_tensor(p + "ffn_gate_inp.bias", vec(N_EXPERT, 1.0))
        w.add_tensor(p + "ffn_gate_exps.weight", exps(N_FF_EXP, N_EMBD, a.g_gate_up))
        w.add_tensor(p + "ffn_gate_exps.bias", vec((N_EXPERT, N_FF_EXP), 1.0))
        w.add_tensor(p + "ffn_up_exps.weight", exps(N_FF_EXP, N_EMBD, a.g_gate_up))
        w.add_tensor(p + "ffn_up_exps.bias", vec((N_EXPERT, N_FF_EXP), 1.0))
        w.add_tensor(p + "ffn_down_exps.weight", exps(N_EMBD, N_FF_EXP, a.g_down))
        w.add_tensor(p + "ffn_down_exps.bias", vec((N_EXPERT, N_EMBD), 0.2))
    w.add_tensor("output_norm.weight", vec(N_EMBD, 0.1, 1.0))
    w.add_tensor("output.weight", mat(N_VOCAB, N_EMBD, a.g_output))
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
    f16_name = "fixture-gptoss-f16"
    src = {t.name: np.asarray(t.data, dtype=np.float32) for t in gguf.GGUFReader(work / f"{f16_name}.gguf").tensors}
    f16_logits = np.fromfile(work / f"{f16_name}.logits.bin", dtype=np.float32).reshape(-1, N_VOCAB)
    n_prompt = len((work / "prompt.txt").read_text().strip().split(","))
    rel = {}
    models = {}
    for name in a.names:
        path = work / f"{name}.gguf"
        nmse_f16 = 0.0
        if name != f16_name:
            for t in gguf.GGUFReader(path).tensors:
                tn = t.tensor_type.name
                if tn == "F32":
                    continue
                x = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
                ref = src[t.name].astype(np.float64).reshape(-1)
                rel[tn] = max(rel.get(tn, 0.0), float(np.linalg.norm(x - ref) / np.linalg.norm(ref)))
            lg = np.fromfile(work / f"{name}.logits.bin", dtype=np.float32).reshape(-1, N_VOCAB)[:n_prompt]
            ref = f16_logits[:n_prompt].astype(np.float64)
            nmse_f16 = float((((lg - ref) ** 2).sum(1) / (ref ** 2).sum(1)).max())
        m = margins[name]
        models[name] = {
            "arch": "gpt-oss",
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


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("gguf_py")
    m.add_argument("llama_fixture")
    m.add_argument("out_dir")
    m.add_argument("--seed", type=int, default=SEED)
    m.add_argument("--window", type=int, default=16, help="attention.sliding_window")
    m.add_argument("--emb", type=float, default=1.0, help="token_embd std")
    m.add_argument("--g-out", type=float, default=0.7, help="attn_output gain")
    m.add_argument("--router-gain", type=float, default=8.0, help="ffn_gate_inp gain")
    m.add_argument("--g-gate-up", type=float, default=4.0, help="expert gate/up gain")
    m.add_argument("--g-down", type=float, default=0.15, help="expert down gain")
    m.add_argument("--g-output", type=float, default=4.5, help="output gain")
    f = sub.add_parser("manifest")
    f.add_argument("gguf_py")
    f.add_argument("work_dir")
    f.add_argument("names", nargs="+")
    a = p.parse_args()
    cmd_model(a) if a.cmd == "model" else cmd_manifest(a)


if __name__ == "__main__":
    main()
