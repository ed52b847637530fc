#include "runtime/request.h"

namespace kiln {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

FinishReason finish_reason_of(StopReason r) {
  switch (r) {
    case StopReason::kNone: return FinishReason::kNone;
    case StopReason::kEog:
    case StopReason::kStopString: return FinishReason::kStop;
    case StopReason::kLimit:
    case StopReason::kContextFull:
    case StopReason::kTimeout: return FinishReason::kLength;
    case StopReason::kCancelled: return FinishReason::kCancelled;
  }
  return FinishReason::kNone;
}

void RequestHandle::push(TokenEvent ev) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

void RequestHandle::finish(RequestEnd end) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    end_ = std::move(end);
  }
  cv_.notify_all();
}

bool RequestHandle::next(std::vector<TokenEvent>& out, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lk(mu_);
  if (events_.empty() && !done_) cv_.wait_for(lk, wait, [&] { return !events_.empty() || done_; });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return !(done_ && events_.empty()) || !out.empty();
}

std::vector<TokenEvent> RequestHandle::wait_all() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_; });
  std::vector<TokenEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

bool RequestHandle::wait_done(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, wait, [&] { return done_; });
}

bool RequestHandle::finished() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}
FinishReason RequestHandle::finish_reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return end_.reason;
}
StopReason RequestHandle::stop_reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return end_.stop;
}
std::string RequestHandle::stop_string() const {
  std::lock_guard<std::mutex> lk(mu_);
  return end_.stop_string;
}
Status RequestHandle::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return end_.error;
}
RequestTimings RequestHandle::timings() const {
  std::lock_guard<std::mutex> lk(mu_);
  return end_.timings;
}
uint64_t RequestHandle::seed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return end_.seed;
}

std::vector<float> RequestHandle::take_embedding() {
  std::lock_guard<std::mutex> lk(mu_);
  return std::move(end_.embedding);
}

}  // namespace kiln
