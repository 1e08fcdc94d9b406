// The helpers of cli/common.h every subcommand shares: sizes, option
// strings, on/off, human sizes, zero blocks and qemu-img's exit codes.
#include "cli/common.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace thindisk::cli {
namespace {

TEST(ParseSizeTest, AcceptsQemuSuffixes) {
  EXPECT_EQ(ParseSize("4096").value(), 4096u);
  EXPECT_EQ(ParseSize("0").value(), 0u);
  EXPECT_EQ(ParseSize("512b").value(), 512u);
  EXPECT_EQ(ParseSize("64k").value(), 64u << 10);
  EXPECT_EQ(ParseSize("64K").value(), 64u << 10);
  EXPECT_EQ(ParseSize("10M").value(), 10ull << 20);
  EXPECT_EQ(ParseSize("2G").value(), 2ull << 30);
  EXPECT_EQ(ParseSize("1T").value(), 1ull << 40);
  EXPECT_EQ(ParseSize("1P").value(), 1ull << 50);
  EXPECT_EQ(ParseSize("3E").value(), 3ull << 60);
  EXPECT_EQ(ParseSize("1.5G").value(), 3ull << 29);
  EXPECT_EQ(ParseSize("0.5k").value(), 512u);
}

TEST(ParseSizeTest, RefusesJunkNegativeAndOverflow) {
  for (const char* bad : {"", "k", "-1", "1Q", "12kb", "1.5", "1.", ".5k", "0x10", "16E",
                          "99999999999999999999", " 1", "1 "}) {
    auto r = ParseSize(bad);
    EXPECT_FALSE(r.has_value()) << "'" << bad << "' parsed";
    if (!r.has_value()) {
      EXPECT_EQ(r.error().code(), Code::kInvalidArgument);
    }
  }
}

TEST(ParseSizeTest, SaysWhenASizeIsTooLarge) {
  for (const char* big : {"16E", "100E", "99999999999999999999", "16384P"}) {
    auto r = ParseSize(big);
    ASSERT_FALSE(r.has_value()) << "'" << big << "' parsed";
    EXPECT_EQ(r.error().message(), std::string("size '") + big +
                                       "' is too large (the largest is 16 EiB - 1 byte)");
  }
  EXPECT_EQ(ParseSize("15E").value(), 15ull << 60);
}

TEST(ParseOptionStringTest, SplitsKeysAndValues) {
  auto o = ParseOptionString("cluster_size=64k,extended_l2=off,lazy_refcounts");
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->size(), 3u);
  EXPECT_EQ(o->at("cluster_size"), "64k");
  EXPECT_EQ(o->at("extended_l2"), "off");
  EXPECT_EQ(o->at("lazy_refcounts"), "on");
}

TEST(ParseOptionStringTest, DoubleCommaIsLiteralAndLaterWins) {
  auto o = ParseOptionString("backing_file=a,,b.qcow2,compat=0.10,compat=1.1,");
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->at("backing_file"), "a,b.qcow2");
  EXPECT_EQ(o->at("compat"), "1.1");
  EXPECT_FALSE(ParseOptionString("=x").has_value());
  EXPECT_TRUE(ParseOptionString("").value().empty());
}

TEST(ParseOnOffTest, KnowsTheSpellings) {
  EXPECT_TRUE(ParseOnOff("k", "on").value());
  EXPECT_FALSE(ParseOnOff("k", "off").value());
  EXPECT_TRUE(ParseOnOff("k", "true").value());
  auto bad = ParseOnOff("extended_l2", "maybe");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("extended_l2"), std::string::npos);
}

TEST(HumanSizeTest, MatchesQemuFormatting) {
  EXPECT_EQ(HumanSize(0), "0 B");
  EXPECT_EQ(HumanSize(512), "512 B");
  EXPECT_EQ(HumanSize(4096), "4 KiB");
  EXPECT_EQ(HumanSize(331776), "324 KiB");
  EXPECT_EQ(HumanSize(10ull << 20), "10 MiB");
  EXPECT_EQ(HumanSize(3ull << 29), "1.5 GiB");
  EXPECT_EQ(HumanSize(1000), "0.977 KiB");
}

TEST(IsAllZeroTest, FindsAnyNonZeroByte) {
  std::vector<uint8_t> buf(100, 0);
  EXPECT_TRUE(IsAllZero(buf.data(), buf.size()));
  EXPECT_TRUE(IsAllZero(buf.data(), 0));
  buf[99] = 1;
  EXPECT_FALSE(IsAllZero(buf.data(), buf.size()));
  EXPECT_TRUE(IsAllZero(buf.data(), 99));
  buf[3] = 1;
  EXPECT_FALSE(IsAllZero(buf.data(), 8));
}

TEST(ExitCodeTest, FollowsQemuImg) {
  EXPECT_EQ(ExitCodeFor(Outcome::kSuccess, ErrorExit::kOne), 0);
  EXPECT_EQ(ExitCodeFor(Outcome::kImagesDiffer, ErrorExit::kTwo), 1);
  EXPECT_EQ(ExitCodeFor(Outcome::kCheckFoundCorruption, ErrorExit::kOne), 2);
  EXPECT_EQ(ExitCodeFor(Outcome::kCheckFoundLeaks, ErrorExit::kOne), 3);
  EXPECT_EQ(ExitCodeFor(Outcome::kCommandFailed, ErrorExit::kOne), 1);
  EXPECT_EQ(ExitCodeFor(Status::NotFound("x"), ErrorExit::kOne), 1);
  EXPECT_EQ(ExitCodeFor(Status::NotFound("x"), ErrorExit::kTwo), 2);
}

}  // namespace
}  // namespace thindisk::cli
