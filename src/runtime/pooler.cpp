// Pooler (runtime/pooler.h) and the engine's embedding setup.
#include "runtime/pooler.h"

#include <algorithm>
#include <cmath>

namespace kiln {

void Pooler::reset() {
  sum_.clear();
  pick_.clear();
  n_ = 0;
}

void Pooler::add(const float* rows, int64_t n, int64_t pos0, bool ends) {
  const size_t d = static_cast<size_t>(head_.n_embd);
  const bool first_here = pos0 == 0 && n > 0;
  const bool last_token = p_ == Pooling::kLast || (p_ == Pooling::kRank && head_.rank_last);
  switch (p_) {
    case Pooling::kNone:
      pick_.insert(pick_.end(), rows, rows + static_cast<size_t>(n) * d);
      break;
    case Pooling::kMean:
      sum_.resize(d, 0.0);
      for (int64_t r = 0; r < n; ++r)
        for (size_t i = 0; i < d; ++i) sum_[i] += rows[static_cast<size_t>(r) * d + i];
      break;
    case Pooling::kCls:
    case Pooling::kLast:
    case Pooling::kRank:
      if (last_token && ends && n > 0) pick_.assign(rows + static_cast<size_t>(n - 1) * d, rows + static_cast<size_t>(n) * d);
      if (!last_token && first_here) pick_.assign(rows, rows + d);
      break;
  }
  n_ += n;
}

std::vector<float> Pooler::result() const {
  const size_t d = static_cast<size_t>(head_.n_embd);
  if (p_ == Pooling::kMean) {
    std::vector<float> v(d, 0.0f);
    if (n_ > 0)
      for (size_t i = 0; i < d; ++i) v[i] = static_cast<float>(sum_[i] / static_cast<double>(n_));
    return v;
  }
  if (p_ != Pooling::kRank) return pick_;
  // The head over the chosen vector: h = tanh(W_dense h + b_dense) when it has a dense layer, then scores = W h + b
  // (none: the dense layer's outputs), then softmax for qwen3 heads.
  std::vector<double> h(pick_.begin(), pick_.end());
  if (!head_.dense_w.empty() && h.size() == d) {
    std::vector<double> t(d);
    for (size_t r = 0; r < d; ++r) {
      double a = head_.dense_b.empty() ? 0.0 : head_.dense_b[r];
      for (size_t i = 0; i < d; ++i) a += static_cast<double>(head_.dense_w[r * d + i]) * h[i];
      t[r] = std::tanh(a);
    }
    h = std::move(t);
  }
  const size_t nc = static_cast<size_t>(head_.n_cls);
  std::vector<double> s(nc, 0.0);
  if (head_.cls_w.empty()) s = h;  // the dense layer alone
  for (size_t c = 0; c < nc && !head_.cls_w.empty() && h.size() == d; ++c) {
    double a = head_.cls_b.empty() ? 0.0 : head_.cls_b[c];
    for (size_t i = 0; i < d; ++i) a += static_cast<double>(head_.cls_w[c * d + i]) * h[i];
    s[c] = a;
  }
  if (head_.cls_softmax && nc > 0) {
    const double mx = *std::max_element(s.begin(), s.end());
    double z = 0;
    for (double& x : s) z += (x = std::exp(x - mx));
    for (double& x : s) x /= z;
  }
  return std::vector<float>(s.begin(), s.end());
}

}  // namespace kiln
