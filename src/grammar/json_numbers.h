// GBNF alternatives for JSON numbers within bounds (internal to the grammar layer).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kiln::grammar {

// The largest magnitude a bound may have; larger bounds are beyond every number the grammars write (integers have
// at most 16 digits), so callers drop them.
inline constexpr int64_t kMaxBoundMagnitude = 9'999'999'999'999'999;

// JSON integers n with lo <= n <= hi (a missing side is unbounded; lo <= hi), no leading zeros, no "-0".
std::string integer_range_gbnf(std::optional<int64_t> lo, std::optional<int64_t> hi);
// JSON numbers x without exponent with lo <(=) x <(=) hi for integer bounds (exclusive when the flag is set).
// Empty when no number satisfies the bounds.
std::string number_range_gbnf(std::optional<int64_t> lo, bool lo_excl, std::optional<int64_t> hi, bool hi_excl);

}  // namespace kiln::grammar
