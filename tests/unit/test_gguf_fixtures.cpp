// Every GGUF llama.cpp produced for the project loads: committed models and vocabs, the full fixture matrix, and
// all tokenizer vocabularies of tokenizer.tar.xz.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "common/test_util.h"
#include "gguf/gguf.h"

namespace kiln::gguf {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> ggufs_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".gguf") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Structural checks every well-formed file passes.
void check_file(const File& f) {
  EXPECT_TRUE(f.version() == 2 || f.version() == 3);
  EXPECT_EQ(f.data_offset() % f.alignment(), 0u);
  uint64_t bytes = 0;
  for (const TensorInfo& t : f.tensors()) {
    EXPECT_GE(t.data, f.mapping()->data() + f.data_offset()) << t.name;
    EXPECT_LE(t.data + t.nbytes, f.mapping()->data() + f.file_size()) << t.name;
    EXPECT_EQ(f.find_tensor(t.name), &t);
    bytes += t.nbytes;
  }
  EXPECT_LE(bytes, f.file_size());
  for (const KeyValue& kv : f.kvs()) EXPECT_EQ(f.find(kv.key), &kv.value);
}

void check_model(const std::string& path) {
  SCOPED_TRACE(path);
  auto f = File::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  check_file(*f);
  auto arch = f->get_str("general.architecture");
  ASSERT_TRUE(arch.is_ok());
  EXPECT_TRUE(*arch == "llama" || *arch == "qwen2" || *arch == "qwen3") << *arch;
  EXPECT_EQ(*f->get_u32(*arch + ".block_count"), 2u);
  EXPECT_EQ(*f->get_u32(*arch + ".embedding_length"), 256u);
  EXPECT_EQ(f->get_str_array("tokenizer.ggml.tokens")->size(), 1000u);
  const TensorInfo* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->ne[0], 256);
  EXPECT_EQ(emb->ne[1], 1000);
  const TensorInfo* norm = f->find_tensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, DType::F32);
}

void check_vocab(const std::string& path) {
  SCOPED_TRACE(path);
  auto f = File::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  check_file(*f);
  auto tokens = f->get_str_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.is_ok()) << tokens.status().to_string();
  EXPECT_GT(tokens->size(), 1000u);
  EXPECT_TRUE(f->get_str("tokenizer.ggml.model").is_ok());
}

TEST(GgufFixtures, CommittedModelsLoad) {
  auto files = ggufs_in(test::data_path("models"));
  ASSERT_GE(files.size(), 4u);
  for (auto& p : files) check_model(p);
}

TEST(GgufFixtures, CommittedVocabsLoad) {
  auto files = ggufs_in(test::vocab_dir());
  ASSERT_GE(files.size(), 1u);
  for (auto& p : files) check_vocab(p);
}

TEST(GgufFixtures, AllFixtureModelsLoad) {
  KILN_REQUIRE_FIXTURES();
  auto files = ggufs_in(test::fixtures_dir() + "/models");
  ASSERT_GE(files.size(), 22u);
  for (auto& p : files) check_model(p);
  // Spot checks of the quantization mixes.
  auto f = File::open(test::fixtures_dir() + "/models/fixture-llama-q4_k_m.gguf");
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, DType::Q4_K);
  EXPECT_EQ(f->find_tensor("output.weight")->type, DType::Q6_K);
  EXPECT_EQ(f->find_tensor("rope_freqs.weight")->type, DType::F32);
}

TEST(GgufFixtures, AllTokenizerVocabsLoad) {
  KILN_REQUIRE_FIXTURES();
  const std::string tar = test::fixtures_dir() + "/tokenizer.tar.xz";
  if (!fs::exists(tar)) GTEST_SKIP() << "skipped: fixtures not found (" << tar << ")";
  std::string tmpl = ::kiln::test::temp_dir() + "kiln_vocab_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string cmd = "tar xJf '" + tar + "' -C '" + tmpl + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto files = ggufs_in(tmpl + "/tokenizer");
  EXPECT_GE(files.size(), 15u);
  for (auto& p : files) check_vocab(p);
  fs::remove_all(tmpl);
}

}  // namespace
}  // namespace kiln::gguf
