// llamacpp_logits MODEL IDS UBATCH NGL OUT: the peer's logits of every position of IDS (teacher forcing), n_ubatch
// UBATCH (1: one token per decode, the incremental path; otherwise the whole sequence in one batch), n_gpu_layers
// NGL, f32 [n][n_vocab] to OUT. A measurement tool for the parity fixtures (dev/peer/parity_spread.sh): how far the
// peer's own other paths (one token at a time, its GPU backend) land from the reference it wrote. Built against a
// llama.cpp build from ../shared/peer; not part of kiln's build.
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>
int main(int argc, char** argv) {
  if (argc != 6) return 2;
  std::vector<llama_token> ids;
  std::stringstream ss(argv[2]);
  for (std::string t; std::getline(ss, t, ',');) ids.push_back(std::atoi(t.c_str()));
  const int ub = std::atoi(argv[3]);
  llama_backend_init();
  auto mp = llama_model_default_params();
  mp.n_gpu_layers = std::atoi(argv[4]);
  llama_model* m = llama_model_load_from_file(argv[1], mp);
  if (!m) return 1;
  auto cp = llama_context_default_params();
  cp.n_ctx = 512, cp.n_batch = 512, cp.n_ubatch = ub, cp.n_threads = 4, cp.n_threads_batch = 4;
  llama_context* ctx = llama_init_from_model(m, cp);
  const int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
  std::vector<float> out;
  // ub 1: one token per decode (the incremental path); else the whole sequence in one batch
  const int step = ub == 1 ? 1 : static_cast<int>(ids.size());
  for (size_t p = 0; p < ids.size(); p += step) {
    const int n = std::min<int>(step, static_cast<int>(ids.size() - p));
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
      b.token[i] = ids[p + i], b.pos[i] = static_cast<int>(p) + i, b.n_seq_id[i] = 1, b.seq_id[i][0] = 0, b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b) != 0) return 3;
    for (int i = 0; i < n; ++i) {
      const float* l = llama_get_logits_ith(ctx, i);
      out.insert(out.end(), l, l + nv);
    }
    llama_batch_free(b);
  }
  FILE* f = std::fopen(argv[5], "wb");
  std::fwrite(out.data(), 4, out.size(), f);
  std::fclose(f);
  return 0;
}
