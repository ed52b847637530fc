// Errors are values: Status for operations without a result, Result<T> for the rest.
// A message names what is at fault (file, byte offset, tensor, field, request parameter); the CLI prints it and
// exits non-zero, the server maps the code to an HTTP status. Nothing in kiln aborts on user input.
#pragma once

#include <cstdarg>
#include <optional>
#include <string>
#include <utility>

namespace kiln {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // a caller/user parameter is wrong (CLI flag, request field, token id)
  kInvalidFile,      // a file is malformed (GGUF structure, truncated data)
  kUnsupported,      // well-formed but not handled (unknown architecture, tensor type)
  kNotFound,         // a key/tensor/file that must exist does not
  kOutOfRange,       // a limit was hit (context full, out of KV blocks)
  kIo,               // the OS said no (open, mmap, write)
  kInternal,         // a kiln bug
};

const char* error_code_name(ErrorCode code);

// printf-style formatting into a std::string.
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrprintf(const char* fmt, va_list ap);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code>: <message>"
  std::string to_string() const;

  // Prefixes context to the message ("loading model.gguf: " + message); no-op on ok.
  Status with_context(const std::string& context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

Status make_error(ErrorCode code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Status status) : status_(std::move(status)) {
    if (status_.is_ok()) status_ = Status(ErrorCode::kInternal, "Result constructed from an ok Status without a value");
  }

  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) is an error.
#define KILN_TRY(expr)                                   \
  do {                                                   \
    ::kiln::Status kiln_try_status_ = (expr);            \
    if (!kiln_try_status_.is_ok()) return kiln_try_status_; \
  } while (0)

// `KILN_ASSIGN_OR_RETURN(auto x, f());` declares x from a Result<T> or returns its Status.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_res_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.is_ok()) return tmp.status();           \
  lhs = std::move(tmp).value()
