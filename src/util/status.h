// Status: the outcome of an operation that can fail, as a value.
//
// A Status carries a code (what kind of failure), the errno that caused it
// (0 when none) and a one-line human message. Library code never throws;
// it returns a Status or a Result<T> (result.h). Errors are mapped to exit
// codes and NBD error codes in exactly one place each (cli/, nbd/).
//
// Thread safety: a Status is a value; distinct objects may be used freely
// from different threads.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace thindisk {

enum class Code {
  kOk = 0,
  kInvalidArgument,  // the caller asked for something malformed
  kNotFound,         // a file, export, snapshot or key does not exist
  kCorrupt,          // on-disk metadata violates the format
  kNotSupported,     // valid, but a feature this build or host lacks
  kIoError,          // the host storage failed (see errno)
  kNoSpace,          // the host storage is full (ENOSPC, EDQUOT)
  kReadOnly,         // a write to something opened read-only
  kOutOfRange,       // beyond the end of a device or a table
  kBusy,             // locked or in use by someone else
  kInternal,         // a bug: an invariant did not hold
};

std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message, int error_number = 0)
      : code_(code), errno_(error_number), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m, int e = 0) { return {Code::kNotFound, std::move(m), e}; }
  static Status Corrupt(std::string m) { return {Code::kCorrupt, std::move(m)}; }
  static Status NotSupported(std::string m, int e = 0) { return {Code::kNotSupported, std::move(m), e}; }
  static Status OutOfRange(std::string m) { return {Code::kOutOfRange, std::move(m)}; }
  static Status ReadOnly(std::string m) { return {Code::kReadOnly, std::move(m)}; }
  static Status Busy(std::string m, int e = 0) { return {Code::kBusy, std::move(m), e}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
  // Maps errno to a code: ENOSPC/EDQUOT -> kNoSpace, EOPNOTSUPP -> kNotSupported,
  // ENOENT -> kNotFound, EROFS/EACCES/EPERM on write -> kReadOnly, others kIoError.
  // The message gets ": strerror(e)" appended.
  static Status FromErrno(int e, std::string context);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  int error_number() const { return errno_; }
  const std::string& message() const { return message_; }

  // "what: message" with the same code and errno, for adding context while
  // an error travels up ("image.qcow2: L2 table at 0x... is not aligned").
  // A message that begins with "what: " already is returned as it is.
  Status WithContext(std::string_view what) const;

  // "CodeName: message" for logs; users see message() alone.
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  int errno_ = 0;
  std::string message_;
};

}  // namespace thindisk

// Returns the Status of `expr` from the current function if it is an error.
#define TD_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::thindisk::Status td_status_ = (expr);      \
    if (!td_status_.ok()) return td_status_;     \
  } while (0)
