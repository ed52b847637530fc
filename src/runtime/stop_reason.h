// Why a sequence stopped generating (Sequence, RequestHandle). No model type: the server sees it.
#pragma once

namespace kiln {

enum class StopReason {
  kNone,         // still running
  kEog,          // the model produced an end-of-generation token (not emitted)
  kLimit,        // max_new_tokens generated
  kContextFull,  // the next token would not fit the sequence's context
  kStopString,   // the text reached one of the request's stop strings
  kCancelled,    // the client cancelled (or hung up)
  kTimeout,      // the request's time limit passed
};
// "none", "eog", "limit", "context_full", "stop_string", "cancelled", "timeout"
const char* stop_reason_name(StopReason r);

}  // namespace kiln
