#include "runtime/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "runtime/dry.h"

namespace kiln {

namespace {

// Descending logit, ties to the lower id: a strict weak order (NaN logits are mapped to -inf on entry).
struct ByLogitDesc {
  template <class C>
  bool operator()(const C& a, const C& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};

// The union of two history windows (-1: everything, 0: nothing).
int64_t wider(int64_t a, int64_t b) { return a < 0 || b < 0 ? -1 : std::max(a, b); }

uint32_t pick_seed(uint64_t seed) {
  if (seed != kRandomSeed) return static_cast<uint32_t>(seed);
  std::random_device rd;
  uint32_t s = rd.entropy() > 0 ? rd() : 0u;
  s ^= static_cast<uint32_t>(std::chrono::system_clock::now().time_since_epoch().count());
  // Never the "random" sentinel itself: the reported seed must reproduce this run when passed back with -s.
  return s == kRandomSeed ? s - 1 : s;
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  int32_t best = logits.empty() ? -1 : 0;
  float best_v = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > best_v) {  // strict: ties keep the lower index; NaN compares false
      best_v = logits[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

int32_t masked_argmax(std::span<const float> logits, std::span<const uint64_t> mask) {
  const size_t d = std::min(logits.size(), mask.size() * 64);
  int64_t best = -1;
  for (size_t w = 0; w * 64 < d; ++w)
    for (uint64_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      const size_t i = w * 64 + static_cast<size_t>(__builtin_ctzll(bits));
      if (i >= d) break;
      const float v = logits[i];
      if (best < 0 || v > logits[best] || (std::isnan(logits[best]) && !std::isnan(v))) best = static_cast<int64_t>(i);
    }
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplerParams& p, int32_t n_vocab)
    : p_(p), n_vocab_(std::max<int32_t>(n_vocab, 0)), seed_(pick_seed(p.seed)), rng_(static_cast<uint32_t>(seed_)),
      xtc_rng_(static_cast<uint32_t>(seed_)) {
  const bool pen = p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  // Mirostat's chain has no penalties and no DRY: no history to keep.
  window_ = mirostat_on() ? 0 : wider(pen ? p_.penalty_last_n : 0, p_.dry_enabled() ? p_.dry_penalty_last_n : 0);
  mu_ = 2.0f * p_.mirostat_tau;
  counts_.assign(static_cast<size_t>(n_vocab_), 0);
  cands_.resize(static_cast<size_t>(n_vocab_));
  if (window_ > 0) history_.reserve(2 * static_cast<size_t>(window_));
  if (p_.dry_enabled() && !mirostat_on()) {
    dry_len_.assign(static_cast<size_t>(n_vocab_), 0);
    const size_t w = p_.dry_penalty_last_n > 0 ? static_cast<size_t>(p_.dry_penalty_last_n) : 0;
    dry_z_.reserve(w);
    dry_touched_.reserve(w > 0 ? std::min(w, static_cast<size_t>(n_vocab_)) : static_cast<size_t>(n_vocab_));
  }
}

int64_t Sampler::history_window() const { return window_; }

Status Sampler::validate() const {
  if (n_vocab_ <= 0) return make_error(ErrorCode::kInvalidArgument, "sampler: n_vocab must be > 0");
  if (!std::isfinite(p_.temp)) return make_error(ErrorCode::kInvalidArgument, "temp: must be finite (got %g)", p_.temp);
  if (!(p_.top_p >= 0.0f) || !std::isfinite(p_.top_p))
    return make_error(ErrorCode::kInvalidArgument, "top_p: must be a finite number >= 0 (got %g)", p_.top_p);
  if (!(p_.min_p >= 0.0f && p_.min_p <= 1.0f))
    return make_error(ErrorCode::kInvalidArgument, "min_p: must be in [0, 1] (got %g)", p_.min_p);
  if (!(p_.repeat_penalty > 0.0f) || !std::isfinite(p_.repeat_penalty) || !std::isfinite(1.0f / p_.repeat_penalty))
    return make_error(ErrorCode::kInvalidArgument, "repeat_penalty: must be finite and > 0 (got %g)",
                      p_.repeat_penalty);
  if (!std::isfinite(p_.presence_penalty))
    return make_error(ErrorCode::kInvalidArgument, "presence_penalty: must be finite (got %g)", p_.presence_penalty);
  if (!std::isfinite(p_.frequency_penalty))
    return make_error(ErrorCode::kInvalidArgument, "frequency_penalty: must be finite (got %g)", p_.frequency_penalty);
  if (p_.penalty_last_n < -1)
    return make_error(ErrorCode::kInvalidArgument, "penalty_last_n: must be >= -1 (got %d)", p_.penalty_last_n);
  if (!(p_.typical_p >= 0.0f) || !std::isfinite(p_.typical_p))
    return make_error(ErrorCode::kInvalidArgument, "typical_p: must be a finite number >= 0 (got %g)", p_.typical_p);
  if (!(p_.xtc_probability >= 0.0f && p_.xtc_probability <= 1.0f))
    return make_error(ErrorCode::kInvalidArgument, "xtc_probability: must be in [0, 1] (got %g)", p_.xtc_probability);
  if (!(p_.xtc_threshold >= 0.0f && p_.xtc_threshold <= 1.0f))
    return make_error(ErrorCode::kInvalidArgument, "xtc_threshold: must be in [0, 1] (got %g)", p_.xtc_threshold);
  if (!(p_.dry_multiplier >= 0.0f) || !std::isfinite(p_.dry_multiplier))
    return make_error(ErrorCode::kInvalidArgument, "dry_multiplier: must be a finite number >= 0 (got %g)",
                      p_.dry_multiplier);
  if (!(p_.dry_base >= 1.0f) || !std::isfinite(p_.dry_base))
    return make_error(ErrorCode::kInvalidArgument, "dry_base: must be a finite number >= 1 (got %g)", p_.dry_base);
  if (p_.dry_allowed_length < 0)
    return make_error(ErrorCode::kInvalidArgument, "dry_allowed_length: must be >= 0 (got %d)", p_.dry_allowed_length);
  if (p_.dry_penalty_last_n < -1)
    return make_error(ErrorCode::kInvalidArgument, "dry_penalty_last_n: must be >= -1 (got %d)", p_.dry_penalty_last_n);
  if (p_.dry_sequence_breakers.size() > DryBreakers::kMaxBreakers)
    return make_error(ErrorCode::kInvalidArgument, "dry_sequence_breakers: at most %zu strings (got %zu)",
                      DryBreakers::kMaxBreakers, p_.dry_sequence_breakers.size());
  for (const std::string& b : p_.dry_sequence_breakers)
    if (b.empty()) return make_error(ErrorCode::kInvalidArgument, "dry_sequence_breakers: an empty string");
  if (p_.mirostat < 0 || p_.mirostat > 2)
    return make_error(ErrorCode::kInvalidArgument, "mirostat: must be 0 (off), 1 or 2 (got %d)", p_.mirostat);
  if (!(p_.mirostat_tau >= 0.0f) || !std::isfinite(p_.mirostat_tau))
    return make_error(ErrorCode::kInvalidArgument, "mirostat_tau: must be a finite number >= 0 (got %g)",
                      p_.mirostat_tau);
  if (!(p_.mirostat_eta >= 0.0f) || !std::isfinite(p_.mirostat_eta))
    return make_error(ErrorCode::kInvalidArgument, "mirostat_eta: must be a finite number >= 0 (got %g)",
                      p_.mirostat_eta);
  for (const LogitBias& b : p_.logit_bias) {
    if (b.token < 0 || b.token >= n_vocab_)
      return make_error(ErrorCode::kInvalidArgument, "logit_bias: token id %d is outside the vocabulary [0, %d)",
                        b.token, n_vocab_);
    if (std::isnan(b.bias) || b.bias == std::numeric_limits<float>::infinity())
      return make_error(ErrorCode::kInvalidArgument, "logit_bias: the bias of token %d must be a number or -inf (got %g)",
                        b.token, b.bias);
  }
  return Status::ok();
}

void Sampler::accept(int32_t token) {
  if (token < 0 || token >= n_vocab_ || window_ == 0) return;
  if (window_ > 0 && history_.size() >= 2 * static_cast<size_t>(window_)) {
    // Keep the window's tail only; erase shifts in place (capacity reserved at construction, no allocation).
    history_.erase(history_.begin(), history_.end() - (window_ - 1));
  }
  history_.push_back(token);
}

void Sampler::reset() {
  history_.clear();
  mu_ = 2.0f * p_.mirostat_tau;
  rng_.seed(static_cast<uint32_t>(seed_));
  xtc_rng_.seed(static_cast<uint32_t>(seed_));
}

double Sampler::uniform() {
  // genrand_res53: 27 + 26 random bits.
  uint32_t a = rng_() >> 5, b = rng_() >> 6;
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

bool Sampler::penalties_active() const {
  if (p_.penalty_last_n == 0 || history_.empty()) return false;
  return p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
}

bool Sampler::dry_active() const {
  return !mirostat_on() && p_.dry_enabled() && static_cast<int64_t>(history_.size()) > p_.dry_allowed_length;
}

void Sampler::apply_logit_bias() {
  for (const LogitBias& b : p_.logit_bias)
    if (b.token >= 0 && b.token < n_vocab_) cands_[static_cast<size_t>(b.token)].logit += b.bias;
}

void Sampler::apply_dry() {
  const size_t n = history_.size();
  const size_t w = p_.dry_penalty_last_n < 0 ? n : std::min(n, static_cast<size_t>(p_.dry_penalty_last_n));
  dry_repeat_lengths(std::span<const int32_t>(history_.data() + (n - w), w), p_.dry_breakers.get(),
                     p_.dry_allowed_length, &dry_z_, &dry_len_, &dry_touched_);
  for (int32_t t : dry_touched_) {
    const int32_t len = dry_len_[static_cast<size_t>(t)] - 1;
    dry_len_[static_cast<size_t>(t)] = 0;
    if (p_.dry_breakers && p_.dry_breakers->single(t)) continue;  // a breaker itself is never penalized
    cands_[static_cast<size_t>(t)].logit -= dry_penalty(p_.dry_multiplier, p_.dry_base, p_.dry_allowed_length, len);
  }
  dry_touched_.clear();
}

void Sampler::apply_penalties() {
  size_t n = history_.size();
  size_t window = p_.penalty_last_n < 0 ? n : std::min(n, static_cast<size_t>(p_.penalty_last_n));
  const int32_t* w = history_.data() + (n - window);
  for (size_t i = 0; i < window; ++i) ++counts_[w[i]];
  // Each distinct token is penalized once (at its first occurrence in the window), then its count is zeroed so
  // counts_ is all zero again when this returns.
  for (size_t i = 0; i < window; ++i) {
    int32_t t = w[i];
    int32_t c = counts_[t];
    if (c == 0) continue;
    counts_[t] = 0;
    float& l = cands_[t].logit;
    l = l <= 0.0f ? l * p_.repeat_penalty : l / p_.repeat_penalty;
    l -= static_cast<float>(c) * p_.frequency_penalty + p_.presence_penalty;
  }
}

size_t Sampler::top_k_cut(size_t n) {
  size_t k = std::min(static_cast<size_t>(p_.top_k), n);
  std::partial_sort(cands_.begin(), cands_.begin() + k, cands_.begin() + n, ByLogitDesc());
  return k;
}

size_t Sampler::typical_cut(size_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, cands_[i].logit);
  if (!std::isfinite(mx)) return n;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (cands_[i].p = std::exp(cands_[i].logit - mx));
  double entropy = 0;
  for (size_t i = 0; i < n; ++i) {
    const double q = cands_[i].p / sum;
    cands_[i].p = static_cast<float>(q);
    if (q > 0) entropy -= q * std::log(q);
  }
  // A token of probability 0 is the least typical of all.
  for (size_t i = 0; i < n; ++i) {
    const double q = cands_[i].p;
    cands_[i].score = q > 0 ? static_cast<float>(std::fabs(-std::log(q) - entropy))
                            : std::numeric_limits<float>::infinity();
  }
  std::sort(cands_.begin(), cands_.begin() + n, [](const Cand& a, const Cand& b) {
    if (a.score != b.score) return a.score < b.score;
    return ByLogitDesc()(a, b);
  });
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += cands_[i].p;
    if (cum > p_.typical_p) return i + 1;
  }
  return n;
}

size_t Sampler::xtc_cut(size_t n, bool sorted) {
  if (n < 2) return n;
  const float chance = static_cast<float>(xtc_rng_() >> 8) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
  if (chance > p_.xtc_probability) return n;
  if (!sorted) std::sort(cands_.begin(), cands_.begin() + n, ByLogitDesc());
  const float mx = cands_[0].logit;
  if (!std::isfinite(mx)) return n;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (cands_[i].p = std::exp(cands_[i].logit - mx));
  // The last of the leading tokens at or above the threshold stays; those before it go.
  size_t last = 0;
  for (size_t i = 0; i < n && cands_[i].p / sum >= p_.xtc_threshold; ++i) last = i;
  if (last == 0) return n;
  std::move(cands_.begin() + last, cands_.begin() + n, cands_.begin());
  return n - last;
}

size_t Sampler::top_p_cut(size_t n, bool sorted) {
  // Softmax over the n survivors (temperature 1), into p.
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, cands_[i].logit);
  if (!std::isfinite(mx)) return n;  // all -inf: nothing to rank by
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (cands_[i].p = std::exp(cands_[i].logit - mx));
  // Without a prior top-k the candidates are unsorted: sort the head first (the mass usually sits in a few
  // hundred tokens) and the rest only if the head does not reach top_p.
  size_t sorted_upto = sorted ? n : std::min<size_t>(n, 256);
  if (!sorted) std::partial_sort(cands_.begin(), cands_.begin() + sorted_upto, cands_.begin() + n, ByLogitDesc());
  const double target = static_cast<double>(p_.top_p) * sum;
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i == sorted_upto) {
      std::sort(cands_.begin() + i, cands_.begin() + n, ByLogitDesc());
      sorted_upto = n;
    }
    cum += cands_[i].p;
    if (cum >= target) return i + 1;
  }
  return n;
}

size_t Sampler::min_p_cut(size_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, cands_[i].logit);
  if (!std::isfinite(mx)) return n;
  const float min_logit = mx + std::log(p_.min_p);
  // Stable in-place compaction: the order (sorted or not) is kept.
  size_t m = 0;
  for (size_t i = 0; i < n; ++i)
    if (cands_[i].logit >= min_logit) cands_[m++] = cands_[i];
  return m;
}

size_t Sampler::mirostat_cut(size_t n, double* sum) {
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, cands_[i].logit /= p_.temp);
  if (!std::isfinite(mx)) {  // every logit -inf: uniform over all (as the default chain)
    for (size_t i = 0; i < n; ++i) cands_[i].p = 1.0f;
    *sum = static_cast<double>(n);
    return n;
  }
  size_t keep = 1;
  if (p_.mirostat == 1) {
    // The Zipf exponent from the top m probabilities; p_i / p_(i+1) = exp(logit_i - logit_(i+1)). Tokens of
    // probability 0 (-inf) give no ratio and are left out of the fit.
    constexpr size_t kM = 100;
    const size_t head = std::min(kM, n);
    std::partial_sort(cands_.begin(), cands_.begin() + head, cands_.begin() + n, ByLogitDesc());
    size_t live = 0;
    while (live < head && std::isfinite(cands_[live].logit)) ++live;
    double tb = 0, tt = 0;
    for (size_t i = 0; i + 1 < live; ++i) {
      const double t = std::log(static_cast<double>(i + 2) / static_cast<double>(i + 1));
      tb += t * (static_cast<double>(cands_[i].logit) - static_cast<double>(cands_[i + 1].logit));
      tt += t * t;
    }
    if (live >= 2) {
      const double s = tb / tt, e = s - 1.0;
      const double k = std::pow(e * std::exp2(static_cast<double>(mu_)) /
                                    (1.0 - std::pow(static_cast<double>(n_vocab_), -e)), 1.0 / s);
      // NaN (s = 1, or no spread) and k < 1 keep the top token, as llama.cpp's max(int(k), 1).
      if (k >= static_cast<double>(n)) keep = n;
      else if (k >= 1.0) keep = static_cast<size_t>(k);
    }
    if (keep > head) std::partial_sort(cands_.begin(), cands_.begin() + keep, cands_.begin() + n, ByLogitDesc());
  } else {
    // v2: the tokens whose surprise -log2 p is at most mu, a prefix of the sorted order (ties alike).
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(cands_[i].logit) - mx);
    size_t m = 0;
    for (size_t i = 0; i < n; ++i) {
      const double q = std::exp(static_cast<double>(cands_[i].logit) - mx) / s;
      if (!(-std::log2(q) > static_cast<double>(mu_))) cands_[m++] = cands_[i];
    }
    if (m == 0) {  // not even the top token: keep it
      for (size_t i = 0; i < n; ++i)
        if (ByLogitDesc()(cands_[i], cands_[0])) cands_[0] = cands_[i];
      m = 1;
    }
    std::sort(cands_.begin(), cands_.begin() + m, ByLogitDesc());
    keep = m;
  }
  // Softmax over the kept tokens (cands_[0] holds the highest logit).
  double s = 0;
  for (size_t i = 0; i < keep; ++i) s += (cands_[i].p = std::exp(cands_[i].logit - cands_[0].logit));
  *sum = s;
  return keep;
}

size_t Sampler::prepare(std::span<const float> logits, double* sum) {
  const size_t nv = std::min(logits.size(), static_cast<size_t>(n_vocab_));
  *sum = 0;
  if (nv == 0) return 0;
  if (argmax_only()) {
    int32_t best = argmax(logits.first(nv));
    cands_[0] = {best, logits[best], 1.0f, 0.0f};
    *sum = 1;
    return 1;
  }

  for (size_t i = 0; i < nv; ++i) {
    float l = logits[i];
    cands_[i] = {static_cast<int32_t>(i), std::isnan(l) ? -std::numeric_limits<float>::infinity() : l, 0.0f, 0.0f};
  }
  if (!p_.logit_bias.empty()) apply_logit_bias();
  if (penalties_active()) apply_penalties();
  if (dry_active()) apply_dry();

  size_t n = nv;
  // The highest logit of cands_[0..n) first (ties to the lower id), with p = 1.
  auto pick_best = [&](size_t m) {
    size_t best = 0;
    for (size_t i = 1; i < m; ++i)
      if (ByLogitDesc()(cands_[i], cands_[best])) best = i;
    cands_[0] = cands_[best];
    cands_[0].p = 1.0f;
    *sum = 1;
    return m > 0 ? size_t{1} : size_t{0};
  };
  // Greedy: top-k, top-p and min-p all keep the top token, so without typical and XTC it is the argmax of the
  // modified logits.
  if (greedy() && (mirostat_on() || (!typical_on() && !xtc_on()))) return pick_best(n);
  if (mirostat_on()) return mirostat_cut(n, sum);

  bool sorted = false;
  if (p_.top_k > 0) {
    n = top_k_cut(n);
    sorted = true;
  }
  if (typical_on()) {
    n = typical_cut(n);
    sorted = false;
  }
  if (p_.top_p < 1.0f) {
    n = top_p_cut(n, sorted);
    sorted = true;
  }
  if (p_.min_p > 0.0f) n = min_p_cut(n);
  if (xtc_on()) n = xtc_cut(n, sorted);
  if (greedy()) return pick_best(n);

  // Temperature and softmax (unnormalized; the draw scales by the sum).
  const float inv_t = 1.0f / p_.temp;
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, cands_[i].logit);
  if (!std::isfinite(mx)) {  // every logit -inf (or NaN): uniform over the survivors
    for (size_t i = 0; i < n; ++i) cands_[i].p = 1.0f;
    *sum = static_cast<double>(n);
    return n;
  }
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += (cands_[i].p = std::exp((cands_[i].logit - mx) * inv_t));
  *sum = s;
  return n;
}

size_t Sampler::draw(size_t n, double sum) {
  if (n == 1) return 0;
  const double r = uniform() * sum;
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += cands_[i].p;
    if (r < cum) return i;
  }
  // r within rounding of sum: the last candidate with non-zero mass.
  for (size_t i = n; i-- > 0;)
    if (cands_[i].p > 0) return i;
  return 0;
}

int32_t Sampler::sample(std::span<const float> logits) {
  double sum = 0;
  const size_t n = prepare(logits, &sum);
  if (n == 0) return -1;
  const size_t i = draw(n, sum);
  if (mirostat_on()) {
    const double surprise = -std::log2(static_cast<double>(cands_[i].p) / sum);
    mu_ -= p_.mirostat_eta * (static_cast<float>(surprise) - p_.mirostat_tau);
  }
  return cands_[i].id;
}

void Sampler::candidates(std::span<const float> logits, std::vector<TokenProb>* out) {
  double sum = 0;
  const size_t n = prepare(logits, &sum);
  out->clear();
  for (size_t i = 0; i < n; ++i) out->push_back({cands_[i].id, static_cast<float>(cands_[i].p / sum)});
}

}  // namespace kiln
