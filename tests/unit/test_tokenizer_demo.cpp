// The embedded demo model's tokenizer (models/kiln-demo.gguf, trained by tools/train_demo/bpe.py): kiln's gpt2 /
// gpt-2 BPE must reproduce the trainer's own encoder id for id. tests/data/demo/heldout.txt is ~3.6 KB of held-out
// KJV chapters plus a paragraph the corpus never has (digits, contractions, tabs, runs of spaces, CRLF, accented
// Latin, CJK, an emoji: byte-level fallback); heldout.ids is bpe.py's encoding of it (no BOS, no special parsing).
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

const char* kModel = KILN_SOURCE_DIR "/models/kiln-demo.gguf";
constexpr int32_t kVocab = 4096;
constexpr int32_t kEot = 4095;  // <|endoftext|>: BOS and EOS

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<int32_t> read_ids(const std::string& path) {
  std::ifstream f(path);
  std::vector<int32_t> ids;
  for (int64_t x; f >> x;) ids.push_back(static_cast<int32_t>(x));
  return ids;
}

class DemoTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = kiln::gguf::File::open(kModel);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    auto tok = kiln::Tokenizer::from_gguf(*file);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    tok_ = std::move(tok).value().release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(tok_, nullptr); }
  static kiln::Tokenizer* tok_;
};
kiln::Tokenizer* DemoTokenizer::tok_ = nullptr;

TEST_F(DemoTokenizer, Vocabulary) {
  EXPECT_EQ(tok_->model_name(), "gpt2");
  EXPECT_EQ(tok_->pre_name(), "gpt-2");
  EXPECT_EQ(tok_->n_vocab(), kVocab);
  EXPECT_EQ(tok_->bos(), kEot);
  EXPECT_EQ(tok_->eos(), kEot);
  EXPECT_TRUE(tok_->add_bos());
  EXPECT_FALSE(tok_->add_eos());
  EXPECT_TRUE(tok_->is_eog(kEot));
  EXPECT_EQ(tok_->token_text(kEot), "<|endoftext|>");
  EXPECT_EQ(tok_->token_type(kEot), kiln::TokenType::kControl);
  // ids 0..255 are the single bytes in byte order, as GPT-2's byte-to-unicode table spells them
  EXPECT_EQ(tok_->token_to_piece(static_cast<int32_t>('A')), "A");
  EXPECT_EQ(tok_->token_to_piece(static_cast<int32_t>('\n')), "\n");
  EXPECT_EQ(tok_->token_text(static_cast<int32_t>(' ')), "\xc4\xa0");  // U+0120 'Ġ'
}

TEST_F(DemoTokenizer, HeldOutTextMatchesTrainer) {
  const std::string text = read_text(kiln::test::data_path("demo/heldout.txt"));
  const std::vector<int32_t> want = read_ids(kiln::test::data_path("demo/heldout.ids"));
  ASSERT_GT(text.size(), 3000u);
  ASSERT_GT(want.size(), 500u);
  const std::vector<int32_t> got = tok_->encode(text, /*add_special=*/false, /*parse_special=*/false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "first difference at token " << i;
  EXPECT_EQ(tok_->decode(got), text);  // byte-level BPE is lossless
}

TEST_F(DemoTokenizer, PromptWithBos) {
  // Training documents start right after <|endoftext|>, so a prompt encoded with BOS starts a chapter.
  // llama.cpp's llama-tokenize gives the same ids for this file.
  EXPECT_EQ(tok_->encode("And God said", true, false), (std::vector<int32_t>{kEot, 295, 386, 387}));
}

TEST_F(DemoTokenizer, SpecialTokenParsing) {
  const std::vector<int32_t> plain = tok_->encode("And", false, false);
  ASSERT_EQ(plain.size(), 1u);  // "And" is a single token of this vocabulary
  EXPECT_EQ(tok_->encode("<|endoftext|>And", false, true), (std::vector<int32_t>{kEot, plain[0]}));
  // without special parsing the marker is ordinary text, never the control token
  for (int32_t id : tok_->encode("<|endoftext|>And", false, false)) EXPECT_NE(id, kEot);
}

}  // namespace
