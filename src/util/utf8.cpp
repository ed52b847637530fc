#include "util/utf8.h"

namespace kiln {

uint32_t decode_utf8(std::string_view s, size_t* pos) {
  const size_t i = *pos;
  const size_t n = s.size();
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const auto cont = [&](size_t k) { return k < n && (b(k) & 0xC0) == 0x80; };
  const uint8_t c = b(i);
  if (c < 0x80) {
    *pos = i + 1;
    return c;
  }
  if ((c & 0xE0) == 0xC0 && cont(i + 1)) {
    *pos = i + 2;
    return ((c & 0x1Fu) << 6) | (b(i + 1) & 0x3Fu);
  }
  if ((c & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
    *pos = i + 3;
    return ((c & 0x0Fu) << 12) | ((b(i + 1) & 0x3Fu) << 6) | (b(i + 2) & 0x3Fu);
  }
  if ((c & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    const uint32_t cp = ((c & 0x07u) << 18) | ((b(i + 1) & 0x3Fu) << 12) | ((b(i + 2) & 0x3Fu) << 6) |
                        (b(i + 3) & 0x3Fu);
    if (cp <= 0x10FFFF) {
      *pos = i + 4;
      return cp;
    }
  }
  *pos = i + 1;
  return kReplacementChar;
}

std::vector<uint32_t> decode_utf8_all(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) out.push_back(decode_utf8(s, &pos));
  return out;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string cp_to_utf8(uint32_t cp) {
  std::string s;
  append_utf8(&s, cp);
  return s;
}

namespace {

// Length of the valid sequence starting at s[i], or 0 when s[i] does not start one.
size_t valid_seq_len(std::string_view s, size_t i) {
  const size_t n = s.size();
  const uint8_t c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > n) return 0;
  for (size_t k = 1; k < len; ++k) {
    const uint8_t d = static_cast<uint8_t>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = valid_seq_len(s, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

bool is_valid_utf8(std::string_view s) {
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = valid_seq_len(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

size_t incomplete_utf8_tail(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t c = static_cast<uint8_t>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
    if (c < 0x80) return 0;
    size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace kiln
