// weightlift/status.h: the one error type of the library (abseil-style codes).
//
// Every fallible function returns Status or Result<T>; no exception crosses the
// public API. A Status names what went wrong and, where known, the file and
// the tensor it concerns, so that a message can always be shown to a user as
//   "<file>: tensor '<name>': <message>".
// Thread-safety: values; safe to copy across threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace wl {

enum class Code : uint8_t {
  kOk = 0,
  kInvalidArgument,   // the caller passed something unusable (bad flag, bad shape)
  kNotFound,          // file, tensor, repository or revision does not exist
  kCorruptData,       // a file's bytes violate its format (abseil's kDataLoss)
  kOutOfRange,        // a range past the end of a file or tensor
  kUnavailable,       // retryable: network down, server busy (429/5xx)
  kCancelled,         // a progress callback asked to stop
  kUnimplemented,     // a valid input we do not support (yet)
  kIoError,           // the OS failed a read or write (EIO, ENOSPC, ...)
  kPermissionDenied,  // EACCES, gated repository, bad token
  kAlreadyExists,
  kInternal,  // a bug in weightlift
  kAborted,   // a concurrent change or a peer's failure stopped the work
              // (a file replaced mid-load, another rank failed); retrying may succeed
};

// Stable lower-case name of a code ("corrupt data"), for messages and tests.
std::string_view code_name(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK: the one spelling (`return Status();`)
  // The message is kept inert (weightlift/text.h).
  Status(Code code, std::string message);

  [[deprecated("write Status() for OK")]] static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status Corrupt(std::string m) { return {Code::kCorruptData, std::move(m)}; }
  static Status OutOfRange(std::string m) { return {Code::kOutOfRange, std::move(m)}; }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status Cancelled(std::string m) { return {Code::kCancelled, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {Code::kUnimplemented, std::move(m)}; }
  static Status IoError(std::string m) { return {Code::kIoError, std::move(m)}; }
  static Status PermissionDenied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }

  // errno translation, in one place: ENOENT -> kNotFound, EACCES -> kPermissionDenied,
  // EINVAL -> kInvalidArgument, everything else kIoError. `what` says what failed.
  static Status FromErrno(int err, std::string_view what);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::string& file() const { return file_; }
  const std::string& tensor() const { return tensor_; }

  // Attach context; only fills a field that is still empty, so the innermost
  // (most precise) context wins. No-ops on OK. Kept inert, as the message is:
  // file() is for showing, not a path to open.
  Status& with_file(std::string_view file) &;
  Status&& with_file(std::string_view file) && { return std::move(with_file(file)); }
  Status& with_tensor(std::string_view tensor) &;
  Status&& with_tensor(std::string_view tensor) && { return std::move(with_tensor(tensor)); }

  // "<file>: tensor '<name>': <message>" (parts omitted when unknown).
  std::string to_string() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
  std::string file_;
  std::string tensor_;
};

// Result<T>: a T or a non-OK Status (std::expected-shaped, for C++20).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<1>, std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::in_place_index<0>, std::move(status)) {  // NOLINT
    if (std::get<0>(v_).ok()) v_.template emplace<0>(Code::kInternal, "Result built from an OK status");
  }
  template <class U>
  requires(std::is_convertible_v<U, T> && !std::is_same_v<std::decay_t<U>, T> &&
           !std::is_same_v<std::decay_t<U>, Status>) Result(U&& value)
      : v_(std::in_place_index<1>, T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return v_.index() == 1; }
  const Status& status() const& {
    static const Status kOk;
    return ok() ? kOk : std::get<0>(v_);
  }
  Status status() && { return ok() ? Status() : std::move(std::get<0>(v_)); }

  // REQUIRES: ok().
  T& value() & { return std::get<1>(v_); }
  const T& value() const& { return std::get<1>(v_); }
  T&& value() && { return std::get<1>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

// What an error is about, added on its way out by the macros below. Like
// with_tensor / with_file it fills only what the error does not name yet.
struct ErrorContext {
  std::string_view tensor;
  std::string_view file;
};
inline Status with_context(Status s) { return s; }
inline Status with_context(Status s, const ErrorContext& c) {
  if (!c.tensor.empty()) s.with_tensor(c.tensor);
  if (!c.file.empty()) s.with_file(c.file);
  return s;
}

#define WL_CONCAT_INNER_(a, b) a##b
#define WL_CONCAT_(a, b) WL_CONCAT_INNER_(a, b)

// WL_RETURN_IF_ERROR(expr) returns expr's error from the caller;
// WL_RETURN_IF_ERROR(expr, .tensor = name, .file = path) names what it was
// about first (either field may be left out; ErrorContext above).
#define WL_RETURN_IF_ERROR(expr, ...)                                                                 \
  do {                                                                                                \
    ::wl::Status wl_status_ = (expr);                                                                 \
    if (!wl_status_.ok())                                                                             \
      return ::wl::with_context(std::move(wl_status_) __VA_OPT__(, ::wl::ErrorContext{__VA_ARGS__})); \
  } while (0)

#define WL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr, ...)                                                             \
  auto tmp = (expr);                                                                                               \
  if (!tmp.ok()) return ::wl::with_context(std::move(tmp).status() __VA_OPT__(, ::wl::ErrorContext{__VA_ARGS__})); \
  lhs = std::move(tmp).value()

// WL_ASSIGN_OR_RETURN(auto x, fallible()); returns the error from the caller.
// WL_ASSIGN_OR_RETURN(auto x, fallible(), .tensor = name, .file = path) names
// what it was about first, as WL_RETURN_IF_ERROR does.
#define WL_ASSIGN_OR_RETURN(lhs, expr, ...) \
  WL_ASSIGN_OR_RETURN_IMPL_(WL_CONCAT_(wl_result_, __LINE__), lhs, expr __VA_OPT__(, ) __VA_ARGS__)

}  // namespace wl
