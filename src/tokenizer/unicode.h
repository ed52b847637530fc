// Unicode for the tokenizers: the text the BPE pre-tokenizer works on, and GPT-2's byte-level map. UTF-8
// encoding and decoding itself (llama.cpp's lenient rules) is util/utf8.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/utf8.h"

namespace kiln::tok {

// Re-encodes `text` code point by code point (decode_utf8 then append_utf8): the text the BPE pre-tokenizer
// works on. `regex_safe` receives the same bytes except that surrogates become U+FFFF (same length, also a
// "not letter / number / space" code point) so PCRE2 in UTF mode accepts it; byte offsets agree between the two.
// Returns false (and leaves both empty) when `text` is already valid, surrogate-free UTF-8 that needs no rewrite.
bool normalize_utf8(std::string_view text, std::string* reencoded, std::string* regex_safe);

// GPT-2 byte-level encoding: every byte maps to one printable code point (bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF
// map to themselves, the other 68 bytes to U+0100.. in order).
const std::string& byte_to_unicode(uint8_t b);
// Inverse: code point -> byte, or -1 when the code point is not one of the 256.
int unicode_to_byte(uint32_t cp);

}  // namespace kiln::tok
