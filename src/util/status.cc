#include "util/status.h"

#include <cerrno>
#include <cstring>

namespace thindisk {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kNotFound: return "not found";
    case Code::kCorrupt: return "corrupt";
    case Code::kNotSupported: return "not supported";
    case Code::kIoError: return "I/O error";
    case Code::kNoSpace: return "no space";
    case Code::kReadOnly: return "read-only";
    case Code::kOutOfRange: return "out of range";
    case Code::kBusy: return "busy";
    case Code::kInternal: return "internal error";
  }
  return "unknown";
}

Status Status::FromErrno(int e, std::string context) {
  Code code = Code::kIoError;
  switch (e) {
    case ENOSPC:
    case EDQUOT: code = Code::kNoSpace; break;
    case EOPNOTSUPP: code = Code::kNotSupported; break;
    case ENOENT: code = Code::kNotFound; break;
    case EROFS:
    case EACCES:
    case EPERM: code = Code::kReadOnly; break;
    case EINVAL: code = Code::kInvalidArgument; break;
    case EAGAIN:
    case EBUSY: code = Code::kBusy; break;
    default: break;
  }
  char buf[128];
  // GNU strerror_r returns the message pointer (may not use buf).
  const char* text = strerror_r(e, buf, sizeof buf);
  return Status(code, context + ": " + text, e);
}

Status Status::WithContext(std::string_view what) const {
  if (ok()) return *this;
  std::string m(what);
  m += ": ";
  // Said once: a message that already begins with the context (a file's
  // own errors name the file) keeps it.
  if (std::string_view(message_).starts_with(m)) return *this;
  m += message_;
  return Status(code_, std::move(m), errno_);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(CodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

}  // namespace thindisk
