// UTF-8 for the grammar layer: strict decoding (no overlong forms, no surrogates, nothing above U+10FFFF: util/utf8
// decodes leniently, as the tokenizers must) and the split of a code point range into byte-range sequences, so
// character classes become byte automata. Encoding is util/utf8's.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Decodes one code point at the start of `s`; returns its length in bytes, 0 when the bytes are not valid UTF-8.
size_t decode_utf8(std::string_view s, uint32_t* cp);
void append_utf8(uint32_t cp, std::string* out);

struct ByteRange {
  uint8_t lo, hi;
};
// One UTF-8 byte pattern: the code points whose encoding is n bytes with byte i in ranges[i].
struct Utf8Sequence {
  int n = 0;
  std::array<ByteRange, 4> ranges{};
};

// The sequences covering exactly the code points lo..hi (surrogates, if inside, included as their 3-byte
// encodings: callers remove surrogates from their ranges first).
std::vector<Utf8Sequence> utf8_sequences(uint32_t lo, uint32_t hi);

}  // namespace kiln::grammar
