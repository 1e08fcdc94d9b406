#include "util/status.h"

#include <cerrno>

#include <gtest/gtest.h>

#include "util/result.h"

namespace thindisk {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  TD_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

TEST(StatusTest, ErrnoMapsToCodes) {
  EXPECT_EQ(Status::FromErrno(ENOSPC, "w").code(), Code::kNoSpace);
  EXPECT_EQ(Status::FromErrno(EOPNOTSUPP, "f").code(), Code::kNotSupported);
  EXPECT_EQ(Status::FromErrno(EIO, "r").code(), Code::kIoError);
  Status s = Status::FromErrno(ENOENT, "disk.qcow2");
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.error_number(), ENOENT);
  EXPECT_EQ(s.message(), "disk.qcow2: No such file or directory");
}

TEST(StatusTest, ContextPrefixesMessageAndKeepsCode) {
  Status s = Status::Corrupt("bad L2").WithContext("a.qcow2");
  EXPECT_EQ(s.message(), "a.qcow2: bad L2");
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_TRUE(Status::Ok().WithContext("x").ok());
}

TEST(StatusTest, ContextIsNotRepeated) {
  Status s = Status::FromErrno(EFBIG, "big.raw: ftruncate").WithContext("big.raw");
  EXPECT_EQ(s.message(), "big.raw: ftruncate: File too large");
  EXPECT_EQ(s.error_number(), EFBIG);
  // Only a whole leading context counts.
  EXPECT_EQ(Status::Corrupt("big.raw.tmp: bad").WithContext("big.raw").message(),
            "big.raw: big.raw.tmp: bad");
}

TEST(ResultTest, PropagatesValuesAndErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "odd");
  EXPECT_FALSE(r.status().ok());
}

TEST(ResultTest, OkStatusIsNotAValue) {
  Result<int> r = Status::Ok();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kInternal);
}

}  // namespace
}  // namespace thindisk
