// Exact digit grammars for bounded JSON integers and integer-bounded JSON numbers (json_schema.cpp).
//
// An integer range [lo, hi] is split by sign; the non-negative part by digit count; a fixed-length range of
// decimal strings [a, b] is written digit by digit: a common first digit is emitted and the rest recursed on,
// otherwise it becomes a[0] + [rest of a .. 9...9] | (a[0]+1 .. b[0]-1) + any digits | b[0] + [0...0 .. rest of b].
// Unbounded magnitudes stop at kMaxDigits digits, as the unbounded integer rule does.
#include "grammar/json_numbers.h"

#include <string>

namespace kiln::grammar {

namespace {

constexpr int kMaxDigits = 16;

std::string digits_between(char a, char b) {
  if (a == b) return std::string("[") + a + "]";
  if (a == '0' && b == '9') return "[0-9]";
  return std::string("[") + a + "-" + b + "]";
}

std::string any_digits(size_t n) {
  if (n == 0) return "";
  if (n == 1) return "[0-9]";
  return "[0-9]{" + std::to_string(n) + "}";
}

// Decimal strings of equal length between a and b inclusive (a <= b).
std::string same_length(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n == 1) return digits_between(a[0], b[0]);
  if (a[0] == b[0]) return std::string("\"") + a[0] + "\" (" + same_length(a.substr(1), b.substr(1)) + ")";
  const std::string rest_a = a.substr(1), rest_b = b.substr(1);
  const std::string nines(n - 1, '9'), zeros(n - 1, '0');
  std::string out;
  char lo_mid = static_cast<char>(a[0] + 1), hi_mid = static_cast<char>(b[0] - 1);
  // A side that covers its whole subrange joins the middle block.
  if (rest_a == zeros) {
    lo_mid = a[0];
  } else {
    out += std::string("\"") + a[0] + "\" (" + same_length(rest_a, nines) + ")";
  }
  const bool b_full = rest_b == nines;
  if (b_full) hi_mid = b[0];
  if (lo_mid <= hi_mid) {
    if (!out.empty()) out += " | ";
    out += digits_between(lo_mid, hi_mid) + " " + any_digits(n - 1);
  }
  if (!b_full) {
    if (!out.empty()) out += " | ";
    out += std::string("\"") + b[0] + "\" (" + same_length(zeros, rest_b) + ")";
  }
  return out;
}

// Non-negative integers in [lo, hi] without leading zeros; hi < 0 means unbounded.
std::string nonneg_range(int64_t lo, int64_t hi) {
  const std::string a = std::to_string(lo);
  std::string out;
  const auto add = [&](const std::string& alt) {
    if (!out.empty()) out += " | ";
    out += "(" + alt + ")";
  };
  const size_t la = a.size();
  const size_t lb = hi < 0 ? std::max<size_t>(kMaxDigits, la) : std::to_string(hi).size();
  for (size_t len = la; len <= lb; ++len) {
    const std::string from = len == la ? a : "1" + std::string(len - 1, '0');
    const std::string to = (hi >= 0 && len == lb) ? std::to_string(hi) : std::string(len, '9');
    if (hi < 0 && len > la) {
      // Every length above the lower bound's: one alternative for all of them.
      add("[1-9] [0-9]{" + std::to_string(len - 1) + "," + std::to_string(lb - 1) + "}");
      break;
    }
    add(same_length(from, to));
  }
  return out;
}

std::string fraction_any() { return "(\".\" [0-9]{1,16})?"; }
std::string fraction_zero() { return "(\".\" \"0\"{1,16})?"; }
// The first non-zero digit comes after zeros only: one way to read each fraction (an ambiguous form such as
// [0-9]* [1-9] [0-9]* makes the automaton track every possible split).
std::string fraction_nonzero() { return "\".\" \"0\"{0,15} [1-9] [0-9]{0,15}"; }

// Non-negative decimals x (no exponent) with lo <(=) x <(=) hi, lo/hi integers >= 0, hi < 0 = unbounded.
std::string nonneg_decimal(int64_t lo, bool lo_excl, int64_t hi, bool hi_excl) {
  std::string out;
  const auto add = [&](const std::string& alt) {
    if (!out.empty()) out += " | ";
    out += "(" + alt + ")";
  };
  if (hi >= 0 && lo == hi) {
    if (!lo_excl && !hi_excl) add("(" + nonneg_range(lo, lo) + ") " + fraction_zero());
    return out;
  }
  // The integer part equal to lo: x >= lo allows any fraction, x > lo a non-zero one.
  add("(" + nonneg_range(lo, lo) + ") " + (lo_excl ? fraction_nonzero() : fraction_any()));
  // Integer parts strictly between: any fraction.
  const int64_t mid_hi = hi < 0 ? -1 : hi - 1;
  if (hi < 0 || lo + 1 <= mid_hi) add("(" + nonneg_range(lo + 1, mid_hi) + ") " + fraction_any());
  // The integer part equal to hi: only hi itself (x <= hi); nothing when x < hi.
  if (hi >= 0 && !hi_excl) add("(" + nonneg_range(hi, hi) + ") " + fraction_zero());
  return out;
}

}  // namespace

std::string integer_range_gbnf(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::string out;
  const auto add = [&](const std::string& alt) {
    if (!out.empty()) out += " | ";
    out += "(" + alt + ")";
  };
  // Negative part: values lo..min(hi, -1), as magnitudes 1..-lo after a minus sign.
  if (!lo || *lo < 0) {
    const int64_t mag_lo = (hi && *hi < 0) ? -*hi : 1;
    const int64_t mag_hi = lo ? -*lo : -1;
    add("\"-\" (" + nonneg_range(mag_lo, mag_hi) + ")");
  }
  if (!hi || *hi >= 0) {
    const int64_t nlo = lo ? std::max<int64_t>(*lo, 0) : 0;
    add(nonneg_range(nlo, hi ? *hi : -1));
  }
  return out;
}

std::string number_range_gbnf(std::optional<int64_t> lo, bool lo_excl, std::optional<int64_t> hi, bool hi_excl) {
  std::string out;
  const auto add = [&](const std::string& alt) {
    if (alt.empty()) return;
    if (!out.empty()) out += " | ";
    out += "(" + alt + ")";
  };
  // x < 0 part, written as "-" and a magnitude m = -x > 0 with -hi <(=) m <(=) -lo.
  if (!lo || *lo < 0) {
    int64_t m_lo = 0;
    bool m_lo_excl = true;  // m > 0
    if (hi && *hi < 0) {
      m_lo = -*hi;
      m_lo_excl = hi_excl;
    }
    const int64_t m_hi = lo ? -*lo : -1;
    const bool m_hi_excl = lo ? lo_excl : false;
    const std::string mag = nonneg_decimal(m_lo, m_lo_excl, m_hi, m_hi_excl);
    if (!mag.empty()) add("\"-\" (" + mag + ")");
  }
  // x >= 0 part.
  if (!hi || *hi > 0 || (*hi == 0 && !hi_excl)) {
    int64_t n_lo = 0;
    bool n_lo_excl = false;
    if (lo && *lo >= 0) {
      n_lo = *lo;
      n_lo_excl = lo_excl;
    }
    add(nonneg_decimal(n_lo, n_lo_excl, hi ? *hi : -1, hi ? hi_excl : false));
  }
  return out;
}

}  // namespace kiln::grammar
