#include "grammar/utf8.h"

#include "util/utf8.h"

namespace kiln::grammar {

size_t decode_utf8(std::string_view s, uint32_t* cp) {
  if (s.empty()) return 0;
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t c = b(0);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t n;
  uint32_t v, min;
  if ((c & 0xE0) == 0xC0) {
    n = 2, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, v = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(i) & 0x3F);
  }
  if (v < min || v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

void append_utf8(uint32_t cp, std::string* out) { kiln::append_utf8(out, cp); }  // util/utf8's encoder

namespace {

int encoded_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void encode(uint32_t cp, uint8_t* out) {
  std::string s;
  append_utf8(cp, &s);
  for (size_t i = 0; i < s.size(); ++i) out[i] = static_cast<uint8_t>(s[i]);
}

}  // namespace

std::vector<Utf8Sequence> utf8_sequences(uint32_t lo, uint32_t hi) {
  // Split first at the encoded-length boundaries, then at continuation-byte boundaries until every piece is a
  // product of byte ranges: a piece [a, b] is one when, for each trailing 6-bit group, either a and b agree on all
  // higher bits or the piece covers that group's full span (a's low bits all 0, b's all 1).
  std::vector<Utf8Sequence> out;
  std::vector<std::pair<uint32_t, uint32_t>> work{{lo, hi}};
  while (!work.empty()) {
    auto [a, b] = work.back();
    work.pop_back();
    if (a > b) continue;
    static constexpr uint32_t kEnds[3] = {0x7F, 0x7FF, 0xFFFF};
    bool split = false;
    for (uint32_t e : kEnds) {
      if (a <= e && b > e) {
        work.push_back({e + 1, b});
        work.push_back({a, e});
        split = true;
        break;
      }
    }
    if (split) continue;
    const int n = encoded_len(a);
    for (int i = 1; i < n && !split; ++i) {
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((a & ~m) != (b & ~m)) {
        if ((a & m) != 0) {
          work.push_back({(a | m) + 1, b});
          work.push_back({a, a | m});
          split = true;
        } else if ((b & m) != m) {
          work.push_back({b & ~m, b});
          work.push_back({a, (b & ~m) - 1});
          split = true;
        }
      }
    }
    if (split) continue;
    Utf8Sequence seq;
    seq.n = n;
    uint8_t ea[4], eb[4];
    encode(a, ea);
    encode(b, eb);
    for (int i = 0; i < n; ++i) seq.ranges[i] = {ea[i], eb[i]};
    out.push_back(seq);
  }
  return out;
}

}  // namespace kiln::grammar
