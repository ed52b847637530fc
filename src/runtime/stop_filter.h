// The one stop-string filter (the scheduler's update() runs it for every request with stop strings: the server's
// "stop", the chat template's stop strings of `kiln chat` and `kiln run --chat`).
//
// Text comes in as it is decoded; push() returns what may be released now. Text is held back while its tail could
// still be the start of a stop string (the longest tail that is a proper prefix of one); once a stop string is
// complete, everything before its first occurrence is released, the stop string and whatever follows are dropped,
// and hit() is true. flush() (at the end of a request) releases what is held back when no stop string completed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class StopFilter {
 public:
  StopFilter() = default;
  // Empty strings are ignored (they would match everywhere); the caller rejects them with a message.
  explicit StopFilter(std::vector<std::string> stops);

  bool empty() const { return stops_.empty(); }
  // Adds a piece; returns the text that can be released now (after a hit: "").
  std::string push(std::string_view piece);
  // The held-back text (no stop string completed); "" after a hit. The filter is empty afterwards.
  std::string flush();
  bool hit() const { return hit_; }
  // The stop string that completed (the one whose first occurrence comes first); "" before a hit.
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not released yet: a possible stop-string start, shorter than the longest stop string
  bool hit_ = false;
  std::string matched_;
};

}  // namespace kiln
