#include "tokenizer/unicode.h"

#include <array>

namespace kiln::tok {

bool normalize_utf8(std::string_view text, std::string* reencoded, std::string* regex_safe) {
  reencoded->clear();
  regex_safe->clear();
  if (is_valid_utf8(text)) return false;
  reencoded->reserve(text.size() + 8);
  regex_safe->reserve(text.size() + 8);
  for (size_t pos = 0; pos < text.size();) {
    const uint32_t cp = decode_utf8(text, &pos);
    append_utf8(reencoded, cp);
    append_utf8(regex_safe, (cp >= 0xD800 && cp <= 0xDFFF) ? 0xFFFF : cp);
  }
  return true;
}

namespace {

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 512> from_unicode;  // code points < 0x144 only
  ByteTables() {
    from_unicode.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      to_unicode[b] = cp_to_utf8(cp);
      from_unicode[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_tables().to_unicode[b]; }

int unicode_to_byte(uint32_t cp) { return cp < 512 ? byte_tables().from_unicode[cp] : -1; }

}  // namespace kiln::tok
