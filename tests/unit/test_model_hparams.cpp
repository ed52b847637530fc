// Hyperparameters against the file (model/hparams.cpp): every count read from metadata is checked against what
// the file holds (blocks, token_embd's shape, the largest tensor) and against fixed bounds, before anything
// proportional to it is allocated. Hostile files are copies of the committed llama fixture with one key changed
// (gguf::Writer); each error must name the key.
#include <functional>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/model.h"
#include "runtime/kv_cache.h"

namespace kiln {
namespace {

const std::string kLlama = "models/fixture-llama-f16.gguf";  // 2 blocks, n_embd 256, vocab 1000, 22 tensors

// Pulls runtime/kv_cache.o into the link: in the sanitizer build, kiln_model's UBSan checks reference the KV
// cache's typeinfo, and kiln_runtime comes before kiln_model on the link line, so a test that uses nothing of the
// runtime itself would not link otherwise.
[[gnu::used]] const auto kLinkRuntime = &KvCache::create;

std::string write_variant(const std::string& name, const std::function<void(gguf::Writer&)>& edit_kv,
                          const std::function<bool(const std::string&)>& keep_tensor = nullptr) {
  static gguf::File src = gguf::File::open(test::data_path(kLlama)).value();
  gguf::Writer w;
  for (const auto& kv : src.kvs()) w.set(kv.key, kv.value);
  edit_kv(w);
  for (const auto& t : src.tensors()) {
    if (keep_tensor && !keep_tensor(t.name)) continue;
    EXPECT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data).is_ok());
  }
  const std::string path = ::kiln::test::temp_dir() + "kiln-hparams-" + name + ".gguf";
  Status st = w.write(path);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return path;
}

// read_common_hparams + the architecture's keys + validate_hparams, as Model::load runs them.
Status read_hparams(const std::string& path, HParams* out = nullptr) {
  auto f = gguf::File::open(path);
  if (!f) return f.status();
  HParams hp;
  KILN_ASSIGN_OR_RETURN(hp.arch, f->get_str("general.architecture"));
  const ArchDef* arch = find_arch(hp.arch);
  if (!arch) return make_error(ErrorCode::kUnsupported, "arch %s", hp.arch.c_str());
  KILN_TRY(read_common_hparams(*f, hp));
  KILN_TRY(arch->read_hparams(*f, hp));
  KILN_TRY(validate_hparams(hp));
  if (out) *out = hp;
  return Status::ok();
}

void expect_error_naming(const Status& st, const std::vector<std::string>& parts) {
  ASSERT_FALSE(st.is_ok()) << "accepted although it should fail: " << parts[0];
  for (const std::string& p : parts)
    EXPECT_NE(st.message().find(p), std::string::npos) << "'" << p << "' not in: " << st.message();
}

TEST(ModelHParams, TheFixtureIsValid) {
  HParams hp;
  Status st = read_hparams(test::data_path(kLlama), &hp);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(hp.n_layer, 2);
  EXPECT_EQ(hp.n_vocab, 1000);
  // The same through a writer copy (so a failure below is the edit, not the copy).
  st = read_hparams(write_variant("copy", [](gguf::Writer&) {}), &hp);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(hp.n_embd, 256);
}

TEST(ModelHParams, BlockCountBeyondTheFileIsRejected) {
  for (uint32_t n : {3u, 10'000'000u, 100'000'000u, 1'000'000'000u, 4'000'000'000u}) {
    Status st = read_hparams(write_variant("blocks" + std::to_string(n),
                                           [n](gguf::Writer& w) { w.set("llama.block_count", n); }));
    expect_error_naming(st, {"llama.block_count is " + std::to_string(n), "only 2 block(s)"});
    EXPECT_EQ(st.code(), ErrorCode::kInvalidFile);
  }
  // A u64 count beyond int64 is an error of the getter, naming the key.
  Status st = read_hparams(write_variant("blocks-u64", [](gguf::Writer& w) {
    w.set("llama.block_count", uint64_t{1} << 63);
  }));
  expect_error_naming(st, {"llama.block_count"});
  // Fewer blocks than the file holds is fine (the manifest binds only what it names); a file missing one block's
  // tensors has fewer distinct blocks than it claims.
  st = read_hparams(write_variant("blocks1", [](gguf::Writer& w) { w.set("llama.block_count", uint32_t{1}); }));
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  st = read_hparams(write_variant("noblk1", [](gguf::Writer&) {},
                                  [](const std::string& n) { return n.rfind("blk.1.", 0) != 0; }));
  expect_error_naming(st, {"llama.block_count is 2", "only 1 block(s)"});
}

TEST(ModelHParams, ModelLoadStopsAtTheCheck) {
  // The whole load path: the error comes from the check, before the layer vector and manifest are built.
  auto m = Model::load(write_variant("load-blocks", [](gguf::Writer& w) {
    w.set("llama.block_count", uint32_t{1'000'000'000});
  }), LoadOptions{});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("llama.block_count is 1000000000, but the file holds tensors of only 2"),
            std::string::npos) << m.status().message();
}

TEST(ModelHParams, WidthsAndHeadCountsBeyondTheFileAreRejected) {
  struct Case {
    const char* key;
    uint64_t value;
    std::vector<std::string> expect;
  } cases[] = {
      {"llama.embedding_length", 1'000'000'000, {"llama.embedding_length is 1000000000", "largest tensor"}},
      {"llama.embedding_length", 512, {"llama.embedding_length is 512", "token_embd.weight has shape [256, 1000]"}},
      {"llama.feed_forward_length", 1'000'000'000'000, {"llama.feed_forward_length", "1000000000000"}},
      {"llama.feed_forward_length", 100'000'000, {"llama.feed_forward_length is 100000000", "largest tensor"}},
      {"llama.attention.head_count", 4'000'000'000, {"llama.attention.head_count", "4000000000"}},
      {"llama.attention.head_count_kv", 1'000'000'000, {"llama.attention.head_count_kv is 1000000000"}},
      {"llama.attention.key_length", 1'000'000'000, {"llama.attention.key_length is 1000000000"}},
      {"llama.vocab_size", 1'000'000'000, {"1000000000", "llama.vocab_size"}},
      {"llama.vocab_size", 1001, {"vocabulary size 1001 (from llama.vocab_size)", "token_embd.weight's 1000 rows"}},
      {"llama.context_length", 1'000'000'000'000, {"llama.context_length is 1000000000000", "more than kiln supports"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + std::to_string(c.value));
    const uint64_t v = c.value;
    const char* k = c.key;
    Status st = read_hparams(write_variant("width" + std::to_string(i++), [k, v](gguf::Writer& w) {
      if (v > UINT32_MAX)
        w.set(k, v);
      else
        w.set(k, static_cast<uint32_t>(v));
    }));
    expect_error_naming(st, c.expect);
  }
}

TEST(ModelHParams, ProductsThatWouldOverflowAreRejected) {
  // Each count below INT32_MAX, the product beyond it (and beyond the file): checked before any multiplication.
  HParams hp;
  hp.arch = "llama";
  hp.n_vocab = 1000;
  hp.n_ctx_train = 2048;
  hp.n_embd = 256;
  hp.n_layer = 2;
  hp.n_ff = 768;
  hp.n_head = 1 << 20;
  hp.n_head_kv = 1 << 20;
  hp.head_dim_k = hp.head_dim_v = 1 << 20;
  hp.n_rot = 64;
  expect_error_naming(validate_hparams(hp), {"llama.attention.head_count x attention.key_length",
                                             "1048576 x 1048576"});
  hp.n_head = hp.n_head_kv = 4;
  hp.head_dim_k = hp.head_dim_v = 64;
  EXPECT_TRUE(validate_hparams(hp).is_ok());
  hp.n_layer = int64_t{1} << 40;
  expect_error_naming(validate_hparams(hp), {"llama.block_count is 1099511627776", "more than kiln supports"});
}

}  // namespace
}  // namespace kiln
