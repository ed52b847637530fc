#include "runtime/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace kiln {

namespace {

// Descending logit, ties to the lower id: a strict weak order (NaN logits are mapped to -inf on entry).
struct ByLogitDesc {
  template <class C>
  bool operator()(const C& a, const C& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};

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

Sampler::Sampler(const SamplerParams& p, int32_t n_vocab)
    : p_(p), n_vocab_(std::max<int32_t>(n_vocab, 0)), seed_(pick_seed(p.seed)), rng_(static_cast<uint32_t>(seed_)) {
  counts_.assign(static_cast<size_t>(n_vocab_), 0);
  cands_.resize(static_cast<size_t>(n_vocab_));
  if (p_.penalty_last_n > 0) history_.reserve(2 * static_cast<size_t>(p_.penalty_last_n));
}

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
  return Status::ok();
}

void Sampler::accept(int32_t token) {
  if (token < 0 || token >= n_vocab_ || p_.penalty_last_n == 0) return;
  if (p_.penalty_last_n > 0 && history_.size() >= 2 * static_cast<size_t>(p_.penalty_last_n)) {
    // Keep the window's tail only; erase shifts in place (capacity reserved at construction, no allocation).
    history_.erase(history_.begin(), history_.end() - (p_.penalty_last_n - 1));
  }
  history_.push_back(token);
}

void Sampler::reset() {
  history_.clear();
  rng_.seed(static_cast<uint32_t>(seed_));
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

size_t Sampler::prepare(std::span<const float> logits, double* sum) {
  const size_t nv = std::min(logits.size(), static_cast<size_t>(n_vocab_));
  *sum = 0;
  if (nv == 0) return 0;
  const bool pen = penalties_active();
  if (greedy() && !pen) {
    int32_t best = argmax(logits.first(nv));
    cands_[0] = {best, logits[best], 1.0f};
    *sum = 1;
    return 1;
  }

  for (size_t i = 0; i < nv; ++i) {
    float l = logits[i];
    cands_[i] = {static_cast<int32_t>(i), std::isnan(l) ? -std::numeric_limits<float>::infinity() : l, 0.0f};
  }
  if (pen) apply_penalties();

  size_t n = nv;
  if (greedy()) {
    // Every truncation keeps the top token, so greedy is the argmax of the penalized logits.
    size_t best = 0;
    for (size_t i = 1; i < n; ++i)
      if (cands_[i].logit > cands_[best].logit) best = i;
    cands_[0] = cands_[best];
    cands_[0].p = 1.0f;
    *sum = 1;
    return 1;
  }

  bool sorted = false;
  if (p_.top_k > 0) {
    n = top_k_cut(n);
    sorted = true;
  }
  if (p_.top_p < 1.0f) {
    n = top_p_cut(n, sorted);
    sorted = true;
  }
  if (p_.min_p > 0.0f) n = min_p_cut(n);

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

int32_t Sampler::sample(std::span<const float> logits) {
  double sum = 0;
  const size_t n = prepare(logits, &sum);
  if (n == 0) return -1;
  if (n == 1) return cands_[0].id;
  const double r = uniform() * sum;
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += cands_[i].p;
    if (r < cum) return cands_[i].id;
  }
  // r within rounding of sum: the last candidate with non-zero mass.
  for (size_t i = n; i-- > 0;)
    if (cands_[i].p > 0) return cands_[i].id;
  return cands_[0].id;
}

void Sampler::candidates(std::span<const float> logits, std::vector<TokenProb>* out) {
  double sum = 0;
  const size_t n = prepare(logits, &sum);
  out->clear();
  for (size_t i = 0; i < n; ++i) out->push_back({cands_[i].id, static_cast<float>(cands_[i].p / sum)});
}

}  // namespace kiln
