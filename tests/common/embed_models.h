// Embedding and reranker test models made from the fixtures (random weights), and the reference the embedding
// tests compare with.
//
// The identity head: output.weight is replaced by an F32 [n_embd, n_vocab] matrix whose row i < n_embd is the unit
// vector e_i (the rest zero, but the rows of "yes"/"no" where asked). The logits of the existing generation path,
// logits[t][i] = e_i . h_t, are then exactly the final-norm hidden state h_t (an F32 dot product of a one-hot row
// adds x * 1 to zeros): an independent route to the vectors the embedding path pools.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/engine_test_util.h"
#include "common/test_util.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "runtime/engine.h"

namespace kiln::test {

struct EmbedModelSpec {
  std::string src = "models/fixture-llama-f16.gguf";  // under tests/data
  int pooling = -1;            // <arch>.pooling_type to write; -1: none
  int cls_out = 0;             // > 0: cls.output.weight F32 [n_embd, cls_out] (pseudo-random)
  bool yes_no = false;         // tokens 990 / 991 renamed "yes" / "no", their output rows pseudo-random
  std::string rerank_template; // tokenizer.chat_template.rerank ("": none)
};

// Deterministic values in [-a, a).
inline float pseudo_random(uint64_t& s, float a) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return (static_cast<float>((s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f) * a;
}

// Writes the model into this test process's temporary folder; returns its path.
inline std::string make_embed_model(const std::string& name, const EmbedModelSpec& spec) {
  const std::string out = temp_dir() + name;
  auto src = gguf::File::open(data_path(spec.src));
  EXPECT_TRUE(src.is_ok()) << src.status().to_string();
  if (!src) return out;
  const std::string arch = src->get_str("general.architecture").value();
  const gguf::TensorInfo* te = src->find_tensor("token_embd.weight");
  const int64_t n_embd = te->ne[0], n_vocab = te->ne[1];
  gguf::Writer w;
  for (const auto& kv : src->kvs()) {
    gguf::Value v = kv.value;
    if (spec.yes_no && kv.key == "tokenizer.ggml.tokens") {
      auto& a = std::get<gguf::Array>(v.v);
      a.items[990] = std::string("yes");
      a.items[991] = std::string("no");
    }
    w.set(kv.key, v);
  }
  if (spec.pooling >= 0) w.set(arch + ".pooling_type", static_cast<uint32_t>(spec.pooling));
  if (!spec.rerank_template.empty()) w.set("tokenizer.chat_template.rerank", spec.rerank_template);
  // Kept alive until write() (the writer borrows the bytes).
  static std::vector<std::vector<float>> keep;
  keep.emplace_back(static_cast<size_t>(n_embd * n_vocab), 0.0f);
  std::vector<float>& head = keep.back();
  for (int64_t i = 0; i < n_embd && i < n_vocab; ++i) head[static_cast<size_t>(i * n_embd + i)] = 1.0f;
  uint64_t seed = 12345;
  if (spec.yes_no)
    for (int64_t r : {990, 991})
      for (int64_t k = 0; k < n_embd; ++k) head[static_cast<size_t>(r * n_embd + k)] = pseudo_random(seed, 0.3f);
  for (const auto& t : src->tensors()) {
    if (t.name == "output.weight") continue;
    EXPECT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data).is_ok());
  }
  EXPECT_TRUE(w.add_tensor("output.weight", DType::F32, {n_embd, n_vocab}, head.data()).is_ok());
  if (spec.cls_out > 0) {
    keep.emplace_back(static_cast<size_t>(n_embd * spec.cls_out));
    for (float& x : keep.back()) x = pseudo_random(seed, 0.3f);
    EXPECT_TRUE(w.add_tensor("cls.output.weight", DType::F32, {n_embd, spec.cls_out}, keep.back().data()).is_ok());
  }
  EXPECT_TRUE(w.write(out).is_ok());
  return out;
}

// The cls.output.weight rows make_embed_model writes (the same generator, same order): [cls_out][n_embd].
inline std::vector<float> cls_rows(int64_t n_embd, int cls_out, bool yes_no) {
  uint64_t seed = 12345;
  if (yes_no)
    for (int i = 0; i < 2 * n_embd; ++i) pseudo_random(seed, 0.3f);
  std::vector<float> w(static_cast<size_t>(n_embd * cls_out));
  for (float& x : w) x = pseudo_random(seed, 0.3f);
  return w;
}

// The final-norm hidden state of every token of `ids` (one sequence, one batch, every row's logits) through the
// generation path of an identity-head model: [ids.size()][n_embd]. With `logits`, the full rows too.
inline std::vector<std::vector<float>> reference_hidden(Model& m, const std::vector<int32_t>& ids,
                                                        std::vector<std::vector<float>>* logits = nullptr) {
  KvCacheConfig kc;
  kc.n_ctx = 512;
  kc.max_seqs = 1;
  kc.batch_tokens = 512;
  kc.max_outputs = 512;
  auto e = Engine::create(m, kc);
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  std::vector<float> all;
  EXPECT_TRUE(run_all(**e, ids, 512, &all).is_ok());
  const int64_t n_embd = m.hparams().n_embd, n_vocab = m.hparams().n_vocab;
  std::vector<std::vector<float>> h;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* row = all.data() + t * static_cast<size_t>(n_vocab);
    h.emplace_back(row, row + n_embd);
    if (logits) logits->emplace_back(row, row + n_vocab);
  }
  return h;
}

inline double cosine_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return 1.0 - ab / std::sqrt(aa * bb);
}

inline std::vector<float> l2_normalized(std::vector<float> v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  const float k = s > 0 ? static_cast<float>(1.0 / std::sqrt(s)) : 0.0f;
  for (float& x : v) x *= k;
  return v;
}

}  // namespace kiln::test
