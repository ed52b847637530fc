#include "tokenizer/wordpiece.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <string>

#include "tokenizer/unicode.h"
#include "tokenizer/unicode_tables.h"

namespace kiln::tok {

uint32_t to_lower(uint32_t cp) {
  // Last run starting at or before cp.
  const LowerRun* end = kLowerRuns + kNumLowerRuns;
  const LowerRun* it = std::upper_bound(kLowerRuns, end, cp, [](uint32_t c, const LowerRun& r) { return c < r.first; });
  if (it == kLowerRuns) return cp;
  --it;
  if (cp > it->last || (cp - it->first) % static_cast<uint32_t>(it->stride) != 0) return cp;
  return static_cast<uint32_t>(static_cast<int64_t>(cp) + it->delta);
}

uint32_t nfd_first(uint32_t cp) {
  const NfdRange* end = kNfdRanges + kNumNfdRanges;
  const NfdRange* it = std::upper_bound(kNfdRanges, end, cp, [](uint32_t c, const NfdRange& r) { return c < r.first; });
  if (it == kNfdRanges) return cp;
  --it;
  return cp <= it->last ? it->nfd : cp;
}

namespace {

enum CharClass : uint8_t { kOther = 0, kSpace, kControl, kPunct, kSymbol, kMark };

// Unicode categories through PCRE2: one anchored match per code point, the capture group says which class.
class Classifier {
 public:
  Classifier() {
    const char* re = R"(([\t-\r\x{85}\p{Z}])|([\p{Cc}\p{Cf}\p{Co}\p{Cs}])|(\p{P})|(\p{S})|(\p{M}))";
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED,
                          &err, &off, nullptr);
    if (code_) pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
    for (uint32_t c = 0; c < 128; ++c) ascii_[c] = classify_slow(c);
  }
  ~Classifier() {
    if (code_) pcre2_code_free(code_);
  }
  CharClass classify(uint32_t cp) const { return cp < 128 ? ascii_[cp] : classify_slow(cp); }

 private:
  CharClass classify_slow(uint32_t cp) const {
    if (!code_) return kOther;
    if (cp >= 0xD800 && cp <= 0xDFFF) return kControl;  // surrogates (Cs) cannot be matched in UTF-8 mode
    const std::string s = cp_to_utf8(cp);
    thread_local pcre2_match_data* md = pcre2_match_data_create(8, nullptr);
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc <= 1) return kOther;
    return static_cast<CharClass>(rc - 1);  // rc - 1 = number of the last group set = the matching alternative
  }
  pcre2_code* code_ = nullptr;
  CharClass ascii_[128];
};

const Classifier& classifier() {
  static const Classifier c;
  return c;
}

bool is_chinese_char(uint32_t cp) {
  // BERT's CJK ranges (including its 0x2B920 start for extension E, as the HF code has it).
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

}  // namespace

void wordpiece_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out) {
  const Classifier& cls = classifier();
  std::vector<std::string> words(1);
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cp = decode_utf8(text, &pos);
    if (vocab.wpm_strip_accents) cp = nfd_first(cp);
    const CharClass c = cls.classify(cp);
    if (c == kSpace) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    if (cp == 0 || cp == kReplacementChar || c == kControl) continue;
    if (vocab.wpm_strip_accents && c == kMark) continue;
    const std::string s = cp_to_utf8(vocab.wpm_lowercase ? to_lower(cp) : cp);
    if (c == kPunct || (cp < 0x7F && c == kSymbol) || is_chinese_char(cp)) {
      if (!words.back().empty()) words.emplace_back();
      words.back() = s;
      words.emplace_back();
    } else {
      words.back() += s;
    }
  }
  if (words.back().empty()) words.pop_back();

  std::string w;
  for (const std::string& word : words) {
    if (word.empty()) continue;
    w = "\xE2\x96\x81" + word;
    const size_t n = w.size();
    const size_t first = out->size();
    for (size_t i = 0; i < n; ++i) {
      bool found = false;
      for (size_t j = std::min(n, i + vocab.max_token_len + 1); j > i; --j) {
        const int32_t id = vocab.find(std::string_view(w).substr(i, j - i));
        if (id >= 0) {
          out->push_back(id);
          found = true;
          i = j - 1;
          break;
        }
      }
      if (!found) {
        out->resize(first);
        break;
      }
    }
    if (out->size() == first && vocab.unk >= 0) out->push_back(vocab.unk);
  }
}

}  // namespace kiln::tok
