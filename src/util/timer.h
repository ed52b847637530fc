#pragma once

#include <chrono>
#include <cstdint>

namespace kiln {

inline int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Timer {
 public:
  Timer() : start_(now_us()) {}
  void reset() { start_ = now_us(); }
  double seconds() const { return static_cast<double>(now_us() - start_) * 1e-6; }
  double ms() const { return static_cast<double>(now_us() - start_) * 1e-3; }

 private:
  int64_t start_;
};

}  // namespace kiln
