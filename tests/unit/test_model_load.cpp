// Model::load: hyperparameters, tensor manifest, errors that name the key / tensor at fault. Broken files are
// made by copying the committed llama fixture with one change (gguf::Writer).
#include <functional>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "model/model.h"

namespace kiln {
namespace {

const std::string kLlama = "models/fixture-llama-f16.gguf";

// Writes a copy of `src` with edit_kv applied to its metadata and tensors filtered/renamed by edit_tensor
// (return false to drop a tensor); returns the new path.
std::string write_variant(const std::string& name, const std::function<void(gguf::Writer&)>& edit_kv,
                          const std::function<bool(std::string&, std::vector<int64_t>&)>& edit_tensor = nullptr) {
  static gguf::File src = gguf::File::open(test::data_path(kLlama)).value();
  gguf::Writer w;
  for (const auto& kv : src.kvs()) w.set(kv.key, kv.value);
  edit_kv(w);
  for (const auto& t : src.tensors()) {
    std::string tn = t.name;
    std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    if (edit_tensor && !edit_tensor(tn, ne)) continue;
    EXPECT_TRUE(w.add_tensor(tn, t.type, ne, t.data).is_ok());
  }
  const std::string path = ::kiln::test::temp_dir() + "kiln-model-" + name + ".gguf";
  EXPECT_TRUE(w.write(path).is_ok());
  return path;
}

Status load_status(const std::string& path) {
  auto m = Model::load(path, LoadOptions{});
  return m.is_ok() ? Status::ok() : m.status();
}

TEST(ModelLoad, FixtureHParams) {
  auto m = Model::load(test::data_path(kLlama), LoadOptions{});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const HParams& hp = m.value()->hparams();
  EXPECT_EQ(hp.arch, "llama");
  EXPECT_EQ(hp.n_embd, 256);
  EXPECT_EQ(hp.n_layer, 2);
  EXPECT_EQ(hp.n_head, 4);
  EXPECT_EQ(hp.n_head_kv, 2);
  EXPECT_EQ(hp.head_dim_k, 64);
  EXPECT_EQ(hp.n_vocab, 1000);
  EXPECT_EQ(hp.rope_type, RopeType::kNormal);
  EXPECT_FALSE(hp.tied_embeddings);
  EXPECT_GT(m.value()->stats().weight_bytes, 0u);

  auto q = Model::load(test::data_path("models/fixture-qwen3-q4_0.gguf"), LoadOptions{});
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_EQ(q.value()->hparams().head_dim_k, 128);  // key_length, not n_embd / n_head = 64
  EXPECT_EQ(q.value()->hparams().rope_type, RopeType::kNeox);
  EXPECT_TRUE(q.value()->hparams().tied_embeddings);
}

TEST(ModelLoad, UnknownArchitectureListsSupported) {
  Status st = load_status(write_variant("arch", [](gguf::Writer& w) { w.set("general.architecture", "gpt9"); }));
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("architecture 'gpt9' is not supported (supported: llama, qwen2, qwen3, gemma3, qwen35, qwen3moe, gpt-oss, bert, nomic-bert)"),
            std::string::npos) << st.message();
}

TEST(ModelLoad, HParamErrorsNameTheKey) {
  Status st = load_status(write_variant("heads0", [](gguf::Writer& w) { w.set("llama.attention.head_count", uint32_t{0}); }));
  EXPECT_EQ(st.code(), ErrorCode::kInvalidFile);
  EXPECT_NE(st.message().find("llama.attention.head_count is 0"), std::string::npos) << st.message();

  st = load_status(write_variant("gqa", [](gguf::Writer& w) { w.set("llama.attention.head_count_kv", uint32_t{3}); }));
  EXPECT_NE(st.message().find("llama.attention.head_count 4 is not a multiple of llama.attention.head_count_kv 3"),
            std::string::npos) << st.message();

  st = load_status(write_variant("ff0", [](gguf::Writer& w) { w.set("llama.feed_forward_length", uint32_t{0}); }));
  EXPECT_NE(st.message().find("llama.feed_forward_length is 0"), std::string::npos) << st.message();

  // A model whose architecture prefix has no keys at all: the first missing key is named.
  st = load_status(write_variant("missing", [](gguf::Writer& w) { w.set("general.architecture", "qwen2"); }));
  EXPECT_EQ(st.code(), ErrorCode::kNotFound);
  EXPECT_NE(st.message().find("qwen2.context_length"), std::string::npos) << st.message();
}

TEST(ModelLoad, ManifestErrorsNameTheTensor) {
  Status st = load_status(write_variant("notensor", [](gguf::Writer&) {}, [](std::string& n, std::vector<int64_t>&) {
    return n != "blk.1.ffn_up.weight";
  }));
  EXPECT_EQ(st.code(), ErrorCode::kNotFound);
  EXPECT_NE(st.message().find("tensor 'blk.1.ffn_up.weight' is missing"), std::string::npos) << st.message();

  st = load_status(write_variant("shape", [](gguf::Writer&) {}, [](std::string& n, std::vector<int64_t>& ne) {
    if (n == "blk.0.attn_k.weight") ne = {128, 256};  // same element count, transposed
    return true;
  }));
  EXPECT_EQ(st.code(), ErrorCode::kInvalidFile);
  EXPECT_NE(st.message().find("tensor 'blk.0.attn_k.weight' has shape [128, 256], expected [256, 128]"),
            std::string::npos) << st.message();

  // No output.weight: tied to token_embd.
  auto path = write_variant("tied", [](gguf::Writer&) {}, [](std::string& n, std::vector<int64_t>&) {
    return n != "output.weight";
  });
  auto m = Model::load(path, LoadOptions{});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_TRUE(m.value()->hparams().tied_embeddings);
}

}  // namespace
}  // namespace kiln
