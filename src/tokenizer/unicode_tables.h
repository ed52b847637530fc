// Code point maps for WordPiece normalization (generated: unicode_tables.cpp, see
// tools/gen_unicode_tables). Everything else Unicode in the tokenizers goes through PCRE2.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::tok {

// Simple lowercase: for cp = first, first + stride, ..., last: lower(cp) = cp + delta. Sorted by `first`.
struct LowerRun {
  uint32_t first, last;
  int32_t stride, delta;
};
// First code point of the NFD decomposition, for cp in [first, last]. Sorted by `first`.
struct NfdRange {
  uint32_t first, last, nfd;
};

extern const LowerRun kLowerRuns[];
extern const size_t kNumLowerRuns;
extern const NfdRange kNfdRanges[];
extern const size_t kNumNfdRanges;

uint32_t to_lower(uint32_t cp);
uint32_t nfd_first(uint32_t cp);

}  // namespace kiln::tok
