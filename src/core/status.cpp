#include "weightlift/status.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "weightlift/text.h"

namespace wl {

std::string_view code_name(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kNotFound: return "not found";
    case Code::kCorruptData: return "corrupt data";
    case Code::kOutOfRange: return "out of range";
    case Code::kUnavailable: return "unavailable";
    case Code::kCancelled: return "cancelled";
    case Code::kUnimplemented: return "unimplemented";
    case Code::kIoError: return "i/o error";
    case Code::kPermissionDenied: return "permission denied";
    case Code::kAlreadyExists: return "already exists";
    case Code::kInternal: return "internal";
    case Code::kAborted: return "aborted";
  }
  return "unknown";
}

Status::Status(Code code, std::string message) : code_(code), message_(inert(message)) {}

Status Status::FromErrno(int err, std::string_view what) {
  std::string msg = fmt::format("{}: {}", what, std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR: return {Code::kNotFound, std::move(msg)};
    case EACCES:
    case EPERM: return {Code::kPermissionDenied, std::move(msg)};
    case EINVAL: return {Code::kInvalidArgument, std::move(msg)};
    case EEXIST: return {Code::kAlreadyExists, std::move(msg)};
    default: return {Code::kIoError, std::move(msg)};
  }
}

Status& Status::with_file(std::string_view file) & {
  if (!ok() && file_.empty()) file_ = inert(file);
  return *this;
}

Status& Status::with_tensor(std::string_view tensor) & {
  if (!ok() && tensor_.empty()) tensor_ = inert(tensor);
  return *this;
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string out;
  if (!file_.empty()) out += file_ + ": ";
  if (!tensor_.empty()) out += "tensor '" + tensor_ + "': ";
  out += message_;
  return out;
}

}  // namespace wl
