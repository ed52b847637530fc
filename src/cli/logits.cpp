// kiln logits: raw logits of a token sequence, for parity checks against llama.cpp (fixtures README).
//   kiln logits -m MODEL --tokens ID,... [--all] [-b N] [-t N] [-c N] --out FILE
// Output: little-endian f32, row-major [n_rows][n_vocab]: the last position, or every position with --all. The ids
// are fed verbatim (no BOS added), in chunks of -b tokens through the KV cache.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/model_source.h"
#include "model/batch.h"
#include "util/timer.h"

namespace kiln::cli {
namespace {

int run_logits(int argc, char** argv) {
  ArgParser ap("logits", "write raw f32 logits of a token sequence ([n_rows][n_vocab], little-endian)");
  std::string tokens_text, out_path;
  bool all = false;
  int64_t n_batch = defaults::kBatch;
  ModelSource src;
  CacheOptions co;
  add_model_options(ap, &src);
  ap.option({"--tokens"}, &tokens_text, "IDS", "token ids, e.g. 1,2,3 (fed verbatim: no BOS is added)");
  ap.flag({"--all"}, &all, "write the logits of every position (default: the last one)");
  ap.option({"-b", "--batch-size"}, &n_batch, "N",
            "tokens per forward pass (default " + std::to_string(defaults::kBatch) + ")");
  add_cache_options(ap, &co, "KV cache size in tokens (default: the number of tokens)");
  ap.option({"-o", "--out"}, &out_path, "FILE", "output file");
  Status st = ap.parse(argc, argv);
  if (!st.is_ok()) return fail("logits", st);
  if (ap.help_requested()) {
    std::printf("%s", ap.usage().c_str());
    return 0;
  }
  if (out_path.empty()) return fail("logits", make_error(ErrorCode::kInvalidArgument, "--out FILE is required"));
  if (!ap.seen("--tokens")) return fail("logits", make_error(ErrorCode::kInvalidArgument, "--tokens is required"));
  if (Status cs = check_generation_options(0, n_batch); !cs) return fail("logits", cs);
  if (Status cs = check_model_options(src); !cs) return fail("logits", cs);
  if (Status cs = check_cache_options(co); !cs) return fail("logits", cs);
  auto ids = parse_id_list(tokens_text);
  if (!ids) return fail("logits", ids.status().with_context("--tokens"));
  const std::vector<int32_t>& tokens = ids.value();
  if (tokens.empty()) return fail("logits", make_error(ErrorCode::kInvalidArgument, "--tokens: the list is empty"));
  if (co.n_ctx > 0 && static_cast<int64_t>(tokens.size()) > co.n_ctx)
    return fail("logits", make_error(ErrorCode::kOutOfRange, "--tokens: %zu ids are more than -c %lld holds",
                                     tokens.size(), static_cast<long long>(co.n_ctx)));

  auto loaded = load_model(src);
  if (!loaded) return fail("logits", loaded.status());
  Model& m = *loaded->model;
  const int64_t n_vocab = m.hparams().n_vocab;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      return fail("logits", make_error(ErrorCode::kInvalidArgument, "--tokens: token %zu (id %d) is out of range "
                                       "[0, %lld)", i, tokens[i], static_cast<long long>(n_vocab)));

  if (co.n_ctx == 0) co.n_ctx = static_cast<int64_t>(tokens.size());
  const int32_t nb = static_cast<int32_t>(n_batch);
  auto engine = make_engine(m, co, 1, nb, all ? nb : 1);
  if (!engine) return fail("logits", engine.status());

  std::FILE* f = std::fopen(out_path.c_str(), "wb");
  if (!f) return fail("logits", make_error(ErrorCode::kIo, "cannot open '%s' for writing", out_path.c_str()));
  Timer timer;
  Batch batch;
  std::vector<float> logits;
  size_t rows = 0;
  for (size_t b = 0; b < tokens.size(); b += static_cast<size_t>(n_batch)) {
    const size_t e = std::min(tokens.size(), b + static_cast<size_t>(n_batch));
    batch.clear();
    for (size_t i = b; i < e; ++i) batch.add(tokens[i], static_cast<int32_t>(i), 0, all || i + 1 == tokens.size());
    st = (*engine)->forward(batch, &logits);
    if (!st.is_ok()) {
      std::fclose(f);
      return fail("logits", st);
    }
    if (!logits.empty() && std::fwrite(logits.data(), sizeof(float), logits.size(), f) != logits.size()) {
      std::fclose(f);
      return fail("logits", make_error(ErrorCode::kIo, "writing '%s' failed", out_path.c_str()));
    }
    rows += logits.size() / static_cast<size_t>(n_vocab);
  }
  if (std::fclose(f) != 0) return fail("logits", make_error(ErrorCode::kIo, "closing '%s' failed", out_path.c_str()));
  std::fprintf(stderr, "logits: %zu tokens, %zu rows x %lld to %s in %.3f s\n", tokens.size(), rows,
               static_cast<long long>(n_vocab), out_path.c_str(), timer.seconds());
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("logits", "raw f32 logits of a token sequence (parity checks)", run_logits);

}  // namespace kiln::cli
