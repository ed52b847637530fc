// UTF-8, written once for the tokenizers, the chat-template interpreter and the stop filter. Decoding follows
// llama.cpp's lenient rules so that token ids match it on any input, valid or not:
//   - the lead byte alone decides the sequence length (no overlong / surrogate checks: "\xC0\xAF" decodes to '/',
//     "\xED\xA0\x80" to U+D800);
//   - a bad lead byte, a truncated sequence or a bad continuation byte yields U+FFFD and consumes one byte;
//   - (kiln only) a 4-byte sequence above U+10FFFF, where llama.cpp throws, also yields U+FFFD for its lead byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Length of the UTF-8 sequence announced by lead byte `c` (1 for continuation or invalid bytes).
inline size_t utf8_len(uint8_t c) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}

// Decodes one code point at `*pos` (advancing it) with the lenient rules above.
uint32_t decode_utf8(std::string_view s, size_t* pos);
// Every code point of `s`, as decode_utf8 reads them.
std::vector<uint32_t> decode_utf8_all(std::string_view s);

// Appends the UTF-8 encoding of `cp` (surrogates are encoded as 3 bytes like any other BMP value).
void append_utf8(std::string* out, uint32_t cp);
std::string cp_to_utf8(uint32_t cp);

// Whether `s` is complete, valid UTF-8 (strict: no overlongs, surrogates or values above U+10FFFF).
bool is_valid_utf8(std::string_view s);
// `s` with every byte that is not part of a valid sequence replaced by U+FFFD (one per byte).
std::string sanitize_utf8(std::string_view s);
// Number of bytes at the end of `s` that form an incomplete (but so far valid) UTF-8 sequence: 0..3.
size_t incomplete_utf8_tail(std::string_view s);

}  // namespace kiln
