// UTF-8 helpers shared by the tokenizers. Decoding follows llama.cpp's lenient rules so that token ids match it
// on any input, valid or not:
//   - the lead byte alone decides the sequence length (no overlong / surrogate checks: "\xC0\xAF" decodes to '/',
//     "\xED\xA0\x80" to U+D800);
//   - a bad lead byte, a truncated sequence or a bad continuation byte yields U+FFFD and consumes one byte;
//   - (kiln only) a 4-byte sequence above U+10FFFF, where llama.cpp throws, also yields U+FFFD for its lead byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the UTF-8 sequence announced by lead byte `c` (1 for continuation or invalid bytes).
inline size_t utf8_len(uint8_t c) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}

// Decodes one code point at `*pos` (advancing it) with the lenient rules above.
uint32_t decode_utf8(std::string_view s, size_t* pos);
std::vector<uint32_t> decode_utf8_all(std::string_view s);

// Appends the UTF-8 encoding of `cp` (surrogates are encoded as 3 bytes like any other BMP value).
void append_utf8(std::string* out, uint32_t cp);
std::string cp_to_utf8(uint32_t cp);

// Re-encodes `text` code point by code point (decode_utf8 then append_utf8): the text the BPE pre-tokenizer
// works on. `regex_safe` receives the same bytes except that surrogates become U+FFFF (same length, also a
// "not letter / number / space" code point) so PCRE2 in UTF mode accepts it; byte offsets agree between the two.
// Returns false (and leaves both empty) when `text` is already valid, surrogate-free UTF-8 that needs no rewrite.
bool normalize_utf8(std::string_view text, std::string* reencoded, std::string* regex_safe);

// Whether `s` is complete, valid UTF-8 (strict: no overlongs, surrogates or values above U+10FFFF).
bool is_valid_utf8(std::string_view s);

// `s` with every byte that is not part of a valid sequence replaced by U+FFFD (one per byte).
std::string sanitize_utf8(std::string_view s);

// Number of bytes at the end of `s` that form an incomplete (but so far valid) UTF-8 sequence: 0..3.
size_t incomplete_utf8_tail(std::string_view s);

// GPT-2 byte-level encoding: every byte maps to one printable code point (bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF
// map to themselves, the other 68 bytes to U+0100.. in order).
const std::string& byte_to_unicode(uint8_t b);
// Inverse: code point -> byte, or -1 when the code point is not one of the 256.
int unicode_to_byte(uint32_t cp);

}  // namespace kiln::tok
