// Tokenizer behaviour beyond the llama.cpp vectors: special tokens, BOS/EOS flags, byte fallback, invalid UTF-8,
// pieces, streaming, metadata errors, and the Unicode helpers. Uses the committed gpt-2 and llama-spm vocabularies.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/unicode_tables.h"

namespace {

using kiln::Tokenizer;
using Ids = std::vector<int32_t>;

std::unique_ptr<Tokenizer> load(const std::string& path) {
  auto f = kiln::gguf::File::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  if (!f) return nullptr;
  auto t = Tokenizer::from_gguf(*f);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return t ? std::move(t).value() : nullptr;
}

const Tokenizer& gpt2() {
  static auto t = load(kiln::test::vocab_path("gpt-2"));
  return *t;
}
const Tokenizer& spm() {
  static auto t = load(kiln::test::vocab_path("llama-spm"));
  return *t;
}

TEST(Tokenizer, Metadata) {
  EXPECT_EQ(gpt2().model_name(), "gpt2");
  EXPECT_EQ(gpt2().pre_name(), "gpt-2");
  EXPECT_EQ(gpt2().n_vocab(), 50257);
  EXPECT_EQ(gpt2().bos(), 50256);
  EXPECT_FALSE(gpt2().add_bos());  // gpt2 model default, no add_bos_token key
  EXPECT_TRUE(gpt2().is_eog(50256));
  EXPECT_EQ(spm().model_name(), "llama");
  EXPECT_EQ(spm().bos(), 1);
  EXPECT_EQ(spm().eos(), 2);
  EXPECT_TRUE(spm().add_bos());
  EXPECT_FALSE(spm().add_eos());
  EXPECT_TRUE(spm().is_eog(2));
  EXPECT_FALSE(spm().is_eog(1));
  EXPECT_EQ(spm().token_type(1), kiln::TokenType::kControl);
  EXPECT_EQ(spm().token_type(3), kiln::TokenType::kByte);
  EXPECT_EQ(spm().token_text(13), "<0x0A>");
}

TEST(Tokenizer, SpecialTokensAreParsedOnlyWhenAskedAndNeverSplit) {
  EXPECT_EQ(gpt2().encode("a<|endoftext|>b", false, true), (Ids{64, 50256, 65}));
  EXPECT_EQ(gpt2().encode("a<|endoftext|>b", false, false), (Ids{64, 27, 91, 437, 1659, 5239, 91, 29, 65}));
  // SPM: text after a special token gets the leading space again (add_space_prefix), as llama.cpp does.
  const Ids with = spm().encode("<s>Hi", false, true);
  ASSERT_GE(with.size(), 2u);
  EXPECT_EQ(with[0], 1);
  EXPECT_EQ(Ids(with.begin() + 1, with.end()), spm().encode("Hi", false, false));
}

TEST(Tokenizer, BosEosFollowTheModelFlags) {
  const Ids plain = spm().encode("Hello", false, false);
  const Ids with = spm().encode("Hello", true, false);
  ASSERT_EQ(with.size(), plain.size() + 1);
  EXPECT_EQ(with[0], 1);
  EXPECT_EQ(Ids(with.begin() + 1, with.end()), plain);
  EXPECT_EQ(gpt2().encode("Hello", true, false), gpt2().encode("Hello", false, false));
  EXPECT_EQ(spm().encode("", true, false), (Ids{1}));
  EXPECT_TRUE(spm().encode("", false, false).empty());
}

TEST(Tokenizer, SpmByteFallback) {
  // U+1F999 has no token: the leading-space token, then its four UTF-8 bytes as <0xNN> (id = 3 + byte).
  EXPECT_EQ(spm().encode("\xF0\x9F\xA6\x99", false, false), (Ids{29871, 3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99}));
  EXPECT_EQ(spm().token_to_piece(13), "\n");
  EXPECT_EQ(spm().decode(spm().encode("a\xF0\x9F\xA6\x99 b", false, false)), "a\xF0\x9F\xA6\x99 b");
}

TEST(Tokenizer, InvalidUtf8IsHandledLikeLlamaCpp) {
  // Byte-level BPE: each bad byte becomes U+FFFD before the merges.
  EXPECT_EQ(gpt2().encode("\xFF", false, false), gpt2().encode("\xEF\xBF\xBD", false, false));
  EXPECT_EQ(gpt2().encode("a\xC3(b\xE2\x82", false, false),
            gpt2().encode("a\xEF\xBF\xBD(b\xEF\xBF\xBD\xEF\xBF\xBD", false, false));
  // SentencePiece keeps the bytes: <0xFF>, and they decode back.
  EXPECT_EQ(spm().encode("\xFF", false, false), (Ids{29871, 3 + 0xFF}));
  EXPECT_EQ(spm().decode(spm().encode("x\xFF\xC3(", false, false)), "x\xFF\xC3(");
}

TEST(Tokenizer, Pieces) {
  EXPECT_EQ(gpt2().token_to_piece(23748), " hello");
  EXPECT_EQ(spm().token_to_piece(1), "");  // control: hidden unless rendered
  EXPECT_EQ(spm().token_to_piece(1, true), "<s>");
  EXPECT_EQ(gpt2().token_to_piece(-1), "");
  EXPECT_EQ(gpt2().token_to_piece(gpt2().n_vocab()), "");
  // decode drops the SPM leading space of the first token only.
  EXPECT_EQ(spm().decode(spm().encode(" two  spaces", false, false)), " two  spaces");
}

TEST(StreamDecoder, NeverEmitsHalfACodePoint) {
  const Ids ids = spm().encode("\xF0\x9F\xA6\x99!", false, false);  // ' ', 4 byte tokens, '!'
  kiln::StreamDecoder sd(spm());
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(sd.push(id));
  out.push_back(sd.flush());
  ASSERT_EQ(out.size(), 7u);
  EXPECT_EQ(out[0], " ");
  EXPECT_EQ(out[1], "");
  EXPECT_EQ(out[2], "");
  EXPECT_EQ(out[3], "");
  EXPECT_EQ(out[4], "\xF0\x9F\xA6\x99");
  EXPECT_EQ(out[5], "!");
  EXPECT_EQ(out[6], "");
}

TEST(StreamDecoder, DanglingAndInvalidBytesBecomeReplacementChars) {
  kiln::StreamDecoder sd(spm());
  EXPECT_EQ(sd.push(3 + 0xE2), "");
  EXPECT_EQ(sd.push(3 + 0x82), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(sd.push(3 + 0xFF), "\xEF\xBF\xBD");
}

// Writes a GGUF holding `kv` (no tensors) and loads a tokenizer from it.
kiln::Status load_from_kv(const std::vector<std::pair<std::string, kiln::gguf::Value>>& kv) {
  kiln::gguf::Writer w;
  for (const auto& [k, v] : kv) w.set(k, v);
  const std::string path = ::kiln::test::temp_dir() + "kiln_tok_meta_test.gguf";
  kiln::Status st = w.write(path);
  if (!st) return st;
  auto f = kiln::gguf::File::open(path);
  std::filesystem::remove(path);
  if (!f) return f.status();
  auto t = Tokenizer::from_gguf(*f);
  return t ? kiln::Status::ok() : t.status();
}

kiln::gguf::Value str_array(std::vector<std::string> xs) {
  kiln::gguf::Array a;
  a.type = kiln::gguf::ValueType::STRING;
  for (auto& x : xs) a.items.emplace_back(std::move(x));
  return a;
}

TEST(Tokenizer, MetadataErrorsNameTheKey) {
  using kiln::gguf::Value;
  const Value tokens = str_array({"a", "b", "ab"});
  auto msg = [](const kiln::Status& s) { return s.message(); };

  kiln::Status s = load_from_kv({{"tokenizer.ggml.tokens", tokens}});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(msg(s).find("tokenizer.ggml.model"), std::string::npos) << msg(s);

  s = load_from_kv({{"tokenizer.ggml.model", Value("llama")}});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(msg(s).find("tokenizer.ggml.tokens"), std::string::npos) << msg(s);

  s = load_from_kv({{"tokenizer.ggml.model", Value("gpt2")}, {"tokenizer.ggml.tokens", tokens}});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(msg(s).find("tokenizer.ggml.merges"), std::string::npos) << msg(s);

  s = load_from_kv({{"tokenizer.ggml.model", Value("gpt2")},
                    {"tokenizer.ggml.pre", Value("no-such-pre")},
                    {"tokenizer.ggml.tokens", tokens},
                    {"tokenizer.ggml.merges", str_array({"a b"})}});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(msg(s).find("no-such-pre"), std::string::npos) << msg(s);

  s = load_from_kv({{"tokenizer.ggml.model", Value("t5")}, {"tokenizer.ggml.tokens", tokens}});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(msg(s).find("t5"), std::string::npos) << msg(s);

  kiln::gguf::Array scores;
  scores.type = kiln::gguf::ValueType::F32;
  scores.items = {Value(0.0f)};
  s = load_from_kv({{"tokenizer.ggml.model", Value("llama")}, {"tokenizer.ggml.tokens", tokens},
                    {"tokenizer.ggml.scores", Value(scores)}});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(msg(s).find("tokenizer.ggml.scores"), std::string::npos) << msg(s);

  s = load_from_kv({{"tokenizer.ggml.model", Value("llama")}, {"tokenizer.ggml.tokens", tokens},
                    {"tokenizer.ggml.bos_token_id", Value("x")}});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(msg(s).find("tokenizer.ggml.bos_token_id"), std::string::npos) << msg(s);

  // A minimal valid BPE: merges by rank.
  s = load_from_kv({{"tokenizer.ggml.model", Value("gpt2")},
                    {"tokenizer.ggml.pre", Value("gpt-2")},
                    {"tokenizer.ggml.tokens", tokens},
                    {"tokenizer.ggml.merges", str_array({"a b"})}});
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(Unicode, LenientDecodingMatchesLlamaCpp) {
  using kiln::decode_utf8_all;
  EXPECT_EQ(decode_utf8_all("a\xC3\xA4"), (std::vector<uint32_t>{'a', 0xE4}));
  EXPECT_EQ(decode_utf8_all("\xC0\xAF"), (std::vector<uint32_t>{'/'}));           // overlong accepted
  EXPECT_EQ(decode_utf8_all("\xED\xA0\x80"), (std::vector<uint32_t>{0xD800}));    // surrogate accepted
  EXPECT_EQ(decode_utf8_all("\xFF\xC3("), (std::vector<uint32_t>{0xFFFD, 0xFFFD, '('}));
  EXPECT_EQ(decode_utf8_all("\xE2\x82"), (std::vector<uint32_t>{0xFFFD, 0xFFFD}));
  EXPECT_FALSE(kiln::is_valid_utf8("\xC0\xAF"));
  EXPECT_TRUE(kiln::is_valid_utf8("\xF0\x9F\xA6\x99"));
  EXPECT_EQ(kiln::incomplete_utf8_tail("ab\xF0\x9F"), 2u);
  EXPECT_EQ(kiln::incomplete_utf8_tail("ab\xF0\x9F\xA6\x99"), 0u);
  EXPECT_EQ(kiln::sanitize_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
}

TEST(Unicode, ByteLevelAlphabet) {
  EXPECT_EQ(kiln::tok::byte_to_unicode('a'), "a");
  EXPECT_EQ(kiln::tok::byte_to_unicode(' '), "\xC4\xA0");  // U+0120 'Ġ'
  for (int b = 0; b < 256; ++b) {
    const std::string u = kiln::tok::byte_to_unicode(static_cast<uint8_t>(b));
    size_t pos = 0;
    EXPECT_EQ(kiln::tok::unicode_to_byte(kiln::decode_utf8(u, &pos)), b);
  }
}

TEST(Unicode, LowercaseAndNfdTables) {
  using kiln::tok::nfd_first;
  using kiln::tok::to_lower;
  EXPECT_EQ(to_lower('A'), uint32_t('a'));
  EXPECT_EQ(to_lower('z'), uint32_t('z'));
  EXPECT_EQ(to_lower(0xC4), 0xE4u);    // Ä
  EXPECT_EQ(to_lower(0x3A3), 0x3C3u);  // Σ
  EXPECT_EQ(to_lower(0x100), 0x101u);  // Ā (stride-2 run)
  EXPECT_EQ(to_lower(0x101), 0x101u);
  EXPECT_EQ(to_lower(0x130), uint32_t('i'));  // İ: simple mapping
  EXPECT_EQ(to_lower(0x41F), 0x43Fu);  // П
  EXPECT_EQ(nfd_first(0xE9), uint32_t('e'));  // é
  EXPECT_EQ(nfd_first(0xC5), uint32_t('A'));  // Å
  EXPECT_EQ(nfd_first('e'), uint32_t('e'));
  EXPECT_EQ(nfd_first(0xAC00), 0x1100u);  // Hangul syllable -> leading jamo
}

TEST(PreTokenizer, WhitespaceRewrite) {
  EXPECT_EQ(kiln::tok::rewrite_regex_for_pcre2(R"(\s+(?!\S)|[^\s\p{L}])"),
            R"([\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}])|[^\t-\r\x{85}\p{Z}\p{L}])");
  EXPECT_EQ(kiln::tok::rewrite_regex_for_pcre2(R"([\]\s])"), R"([\]\t-\r\x{85}\p{Z}])");
  // Regexes without \p{..}: classes of non-ASCII members never match non-ASCII whitespace (llama.cpp's wregex path).
  EXPECT_EQ(kiln::tok::rewrite_regex_for_pcre2(R"([a\x{3000}-\x{3002}]+)"),
            R"((?:(?![\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}])[a\x{3000}-\x{3002}])+)");
  EXPECT_EQ(kiln::tok::rewrite_regex_for_pcre2(R"(\p{N}|[\x{3000}])"), R"(\p{N}|[\x{3000}])");
  auto spec = kiln::tok::pretokenizer_spec("llama-bpe");
  ASSERT_TRUE(spec.is_ok());
  EXPECT_TRUE(spec->ignore_merges);
  auto pre = kiln::tok::PreTokenizer::get(*spec);
  ASSERT_TRUE(pre.is_ok()) << pre.status().to_string();
  std::vector<kiln::tok::Span> words;
  const std::string text = "Hello  world\xC2\x85\xC2\x85x 12345";  // U+0085 counts as whitespace
  (*pre)->split(text, &words);
  std::vector<std::string> got;
  for (auto w : words) got.push_back(text.substr(w.begin, w.end - w.begin));
  EXPECT_EQ(got, (std::vector<std::string>{"Hello", " ", " world", "\xC2\x85", "\xC2\x85x", " ", "123", "45"}));
  EXPECT_FALSE(kiln::tok::pretokenizer_spec("nope").is_ok());
}

// gpt-4o (o200k, gpt-oss): letter runs split at a lower-to-upper case change, contractions stay on an upper-case
// run, digits in threes, a punctuation byte leads the letters after it.
TEST(PreTokenizer, Gpt4oSplitsCaseRunsAndDigits) {
  auto spec = kiln::tok::pretokenizer_spec("gpt-4o");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  auto pre = kiln::tok::PreTokenizer::get(*spec);
  ASSERT_TRUE(pre.is_ok()) << pre.status().to_string();
  std::vector<kiln::tok::Span> words;
  const std::string text = "Hello WORLD's camelCase 12345 a/b\n\n";
  (*pre)->split(text, &words);
  std::vector<std::string> got;
  for (auto w : words) got.push_back(text.substr(w.begin, w.end - w.begin));
  EXPECT_EQ(got, (std::vector<std::string>{"Hello", " WORLD's", " camel", "Case", " ", "123", "45", " a", "/b", "\n\n"}));
}

}  // namespace
