// /metrics: Prometheus text exposition of the server's HTTP counters and the scheduler's stats.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "runtime/scheduler.h"

namespace kiln::server {

class HttpCounters {
 public:
  void count(const std::string& endpoint, int status);
  std::map<std::pair<std::string, int>, uint64_t> snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> by_status_;
};

// in_flight: HTTP requests being handled; loading: the model is not ready (no scheduler stats yet).
std::string render_metrics(const HttpCounters& http, const SchedulerStats* s, int64_t in_flight, double uptime_s);

}  // namespace kiln::server
