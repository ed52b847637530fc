#include "runtime/stop_filter.h"

#include <algorithm>

namespace kiln {

StopFilter::StopFilter(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopFilter::push(std::string_view piece) {
  if (hit_) return "";
  if (stops_.empty()) return std::string(piece);
  // held_ is shorter than the longest stop string (the tail kept below), so searching all of it is cheap.
  held_.append(piece);
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at < cut) cut = at, matched_ = s;
  }
  if (cut != std::string::npos) {
    hit_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // The longest tail of held_ that is a proper prefix of a stop string stays.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopFilter::flush() {
  std::string out;
  if (!hit_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace kiln
