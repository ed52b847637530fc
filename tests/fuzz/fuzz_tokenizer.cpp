// Fuzz target: arbitrary bytes through encode / decode / StreamDecoder with the gpt-2 (byte-level BPE) and
// llama-spm (SentencePiece) vocabularies of tests/data/tokenizer.tar.xz.
// Input: byte 0 = options (bit 0: vocabulary, bit 1: add_special, bit 2: parse_special), the rest = text.
// Checks: every id is in range; StreamDecoder output is valid UTF-8 and equals the sanitized decode; for valid
// UTF-8 text without special-token parsing, decode(encode(text)) == text (both tokenizers are lossless there,
// except that llama-spm reads a literal U+2581 as a space).
// The vocabularies are found through $KILN_TEST_DATA_DIR, else relative to this source file.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "fuzz_data.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

std::unique_ptr<kiln::Tokenizer> load(const char* name) { return kiln::fuzz::load_vocab(name, "fuzz_tokenizer"); }

const uint8_t* g_data = nullptr;  // the current input, printed when a check fails
size_t g_size = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: check failed: %s; input:", what);
    for (size_t i = 0; i < g_size; ++i) std::fprintf(stderr, " %02x", g_data[i]);
    std::fprintf(stderr, "\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<kiln::Tokenizer> toks[2] = {load("gpt-2"), load("llama-spm")};
  if (size == 0) return 0;
  g_data = data;
  g_size = size;
  const uint8_t opt = data[0];
  const kiln::Tokenizer& tok = *toks[opt & 1];
  const bool add_special = opt & 2, parse_special = opt & 4;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);

  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  for (int32_t id : ids) check(id >= 0 && id < tok.n_vocab(), "id in range");

  const std::string decoded = tok.decode(ids);
  // SentencePiece writes spaces as U+2581, so a literal U+2581 in the text comes back as a space.
  const bool spm_ambiguous = (opt & 1) && text.find("\xE2\x96\x81") != std::string::npos;
  if (!add_special && !parse_special && !spm_ambiguous && kiln::is_valid_utf8(text))
    check(decoded == text, "lossless round trip");

  kiln::StreamDecoder sd(tok);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = sd.push(id);
    check(kiln::is_valid_utf8(piece), "streamed piece is valid UTF-8");
    streamed += piece;
  }
  streamed += sd.flush();
  check(kiln::is_valid_utf8(streamed), "stream output is valid UTF-8");
  // The stream sees the same bytes as decode (without its first-space rule), so after sanitizing both agree.
  std::string all;
  for (int32_t id : ids) all += tok.token_to_piece(id);
  check(streamed == kiln::sanitize_utf8(all), "stream == sanitized concatenation");

  // Arbitrary ids (from the same bytes) must not crash the decoders either.
  std::vector<int32_t> raw;
  for (size_t i = 1; i + 4 <= size && raw.size() < 64; i += 4) {
    int32_t v;
    std::memcpy(&v, data + i, 4);
    raw.push_back(v % (tok.n_vocab() + 8));
  }
  (void)tok.decode(raw, /*render_special=*/true);
  return 0;
}
