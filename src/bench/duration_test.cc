#include "bench/duration.h"

#include <gtest/gtest.h>

namespace thindisk::bench {
namespace {

using std::chrono::microseconds;

TEST(ParseDurationTest, AcceptsMicrosMillisSecondsAndBareZero) {
  EXPECT_EQ(*ParseDuration("1ms", "--latency"), microseconds(1000));
  EXPECT_EQ(*ParseDuration("500us", "--latency"), microseconds(500));
  EXPECT_EQ(*ParseDuration("2s", "--latency"), microseconds(2000000));
  EXPECT_EQ(*ParseDuration("0", "--latency"), microseconds(0));
  EXPECT_EQ(*ParseDuration("0ms", "--latency"), microseconds(0));
  EXPECT_EQ(*ParseDuration("10s", "--latency"), kMaxLatency);
}

TEST(ParseDurationTest, RejectsGarbageNamingTheOption) {
  for (const char* bad :
       {"", "fast", "1", "1m", "1 ms", "ms", "-1ms", "1.5ms", "1msx", "0x10us"}) {
    auto d = ParseDuration(bad, "--latency");
    ASSERT_FALSE(d.has_value()) << bad;
    EXPECT_EQ(d.error().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(d.error().message().find("--latency"), std::string::npos)
        << d.error().message();
    EXPECT_NE(d.error().message().find(std::string("'") + bad + "'"), std::string::npos)
        << d.error().message();
  }
}

TEST(ParseDurationTest, RejectsTooLongWithoutOverflow) {
  for (const char* big :
       {"11s", "10001ms", "18446744073709551615s", "99999999999999999999999us"}) {
    auto d = ParseDuration(big, "--latency");
    ASSERT_FALSE(d.has_value()) << big;
    EXPECT_NE(d.error().message().find("too long"), std::string::npos)
        << d.error().message();
  }
}

TEST(FormatDurationTest, LargestExactUnitAndParsesBack) {
  EXPECT_EQ(FormatDuration(microseconds(0)), "0");
  EXPECT_EQ(FormatDuration(microseconds(500)), "500us");
  EXPECT_EQ(FormatDuration(microseconds(1000)), "1ms");
  EXPECT_EQ(FormatDuration(microseconds(1500)), "1500us");
  EXPECT_EQ(FormatDuration(kMaxLatency), "10s");
  for (int64_t us : {0, 7, 1000, 2500, 3000000}) {
    EXPECT_EQ(*ParseDuration(FormatDuration(microseconds(us)), "--latency"),
              microseconds(us));
  }
}

}  // namespace
}  // namespace thindisk::bench
