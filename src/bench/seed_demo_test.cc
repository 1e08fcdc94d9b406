#include "bench/seed_demo.h"

#include <gtest/gtest.h>

#include <string>

namespace thindisk::bench {
namespace {

// Has(s, part): s contains part; on failure the message shows both.
::testing::AssertionResult Has(const std::string& s, const std::string& part) {
  if (s.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << s << "\"\n  does not contain \"" << part << "\"";
}
::testing::AssertionResult Lacks(const std::string& s, const std::string& part) {
  if (s.find(part) == std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << s << "\"\n  contains \"" << part << "\"";
}

// A pass as RunSeedDemo fills it in: `bytes` written in `block` requests at
// `kb_per_s`, causing `fill` and `metadata` host bytes besides the data.
SeedPass MakePass(uint32_t block, uint64_t bytes, double kb_per_s, uint64_t fill = 0, uint64_t metadata = 0) {
  SeedPass p;
  p.block_size = block;
  p.bytes = bytes;
  p.kb_per_s = kb_per_s;
  p.seconds = double(bytes) / kb_per_s / 1000;
  p.data_bytes = bytes;
  p.fill_bytes = fill;
  p.metadata_bytes = metadata;
  p.host_bytes_written = bytes + fill + metadata;
  p.write_amplification = double(p.host_bytes_written) / double(bytes);
  return p;
}

constexpr uint64_t kMiB = 1 << 20;

// The seed's dd bs=1k: 1024 bytes at 421 kB/s is 1024 / 421000 s = 2.43 ms.
TEST(SeedDemoExplainTest, FastFreshWritesSayNoRequestWaitedAndCompareWithTheSeed) {
  // 1024 bytes at 204800 kB/s: 5 us each, 204800 / 421 = 486.5x the seed.
  std::string s = ExplainSpeed(0, MakePass(1024, kMiB, 204800));
  EXPECT_TRUE(Has(s, "204800 kB/s, 5.0 us per 1 KiB write"));
  EXPECT_TRUE(Has(s, "486.5x the seed's 421 kB/s (2.43 ms per 1 KiB write)"));
  EXPECT_TRUE(Has(s, "No request waited on the disk"));
  EXPECT_TRUE(Has(s, "first-touch allocation"));
  EXPECT_TRUE(Has(s, "1024 host bytes of data and fill per 1 KiB write (1.00x)"));
}

TEST(SeedDemoExplainTest, ASeedLikeRateWithAClusterFillPerWriteBlamesTheFill) {
  // Each 1 KiB write filling a 2 MiB cluster: 2048x, at the seed's rate.
  std::string slow = ExplainSpeed(0, MakePass(1024, kMiB, 421, 2047 * kMiB));
  std::string fast = ExplainSpeed(0, MakePass(1024, kMiB, 204800));
  EXPECT_NE(slow, fast);
  EXPECT_TRUE(Has(slow, "421 kB/s, 2.43 ms per 1 KiB write: 1.0x the seed's"));
  EXPECT_TRUE(Has(slow, "each paid 2097152 host bytes of data and fill per 1 KiB write (2048.00x)"));
  EXPECT_TRUE(Has(slow, "the extra host bytes, not the engine, set this rate"));
  EXPECT_TRUE(Lacks(slow, "No request waited"));
}

TEST(SeedDemoExplainTest, ASlowRateWithoutExtraBytesBlamesTheHost) {
  // 300 kB/s: 1024000 / 300 = 3413 us per write, 300 / 421 = 71% of the seed.
  // 4 MiB of metadata (5x in all) was written by the untimed flush after
  // the pass, not inside the requests: it does not explain their time.
  std::string s = ExplainSpeed(0, MakePass(1024, kMiB, 300, 0, 4 * kMiB));
  EXPECT_TRUE(Has(s, "300 kB/s, 3.41 ms per 1 KiB write: 71% of the seed's 421 kB/s"));
  EXPECT_TRUE(Has(s, "each paid only 1024 host bytes of data and fill per 1 KiB write (1.00x)"));
  EXPECT_TRUE(Has(s, "the time went to the host"));
}

TEST(SeedDemoExplainTest, FastRewritesNameTheInPlacePath) {
  std::string s = ExplainSpeed(1, MakePass(1024, kMiB, 102400));
  EXPECT_TRUE(Has(s, "102400 kB/s, 10.0 us per 1 KiB write: 243.2x the seed's"));
  EXPECT_TRUE(Has(s, "rewrites of allocated space change no mapping"));
  EXPECT_TRUE(Lacks(s, "first-touch allocation"));
}

TEST(SeedDemoExplainTest, TheFlushedPassReadsAsBandwidthAgainstTheSeedsCostPerRequest) {
  // 1 MiB at 500000 kB/s: 2097 us; 1 KiB transfers in 2.048 us, and the
  // seed's 2432 us per write is 500000 / 421 = 1187.6x that.
  std::string fast_disk = ExplainSpeed(2, MakePass(kMiB, 8 * kMiB, 500000));
  EXPECT_TRUE(Has(fast_disk, "500.0 MB/s, 2.10 ms per 1 MiB write"));
  EXPECT_TRUE(Has(fast_disk, "1 KiB takes 2.0 us to transfer, and a 1 KiB write at the seed's 421 kB/s "
                             "took 2.43 ms, 1187.6x that"));
  // A disk slower than the seed's rate explains the seed by itself.
  std::string slow_disk = ExplainSpeed(2, MakePass(kMiB, 8 * kMiB, 400));
  EXPECT_TRUE(Has(slow_disk, "0.4 MB/s, 2.62 s per 1 MiB write"));
  EXPECT_TRUE(Has(slow_disk, "no more than the seed's 421 kB/s"));
  EXPECT_TRUE(Lacks(slow_disk, "to transfer"));
}

TEST(SeedDemoExplainTest, AnUntimedPassSaysSo) {
  SeedPass p = MakePass(1024, kMiB, 1);
  p.kb_per_s = 0;
  EXPECT_EQ(ExplainSpeed(0, p), "Not measured (the pass took no time).");
}

TEST(SeedDemoExplainTest, AmplificationSaysWhereTheExtraBytesWent) {
  // Fresh space needs no fill: the data plus the flushed metadata.
  SeedPass fresh = MakePass(1024, kMiB, 1000, 0, 2 * 131072);
  std::string no_fill = ExplainAmplification(0, 128 * 1024, true, fresh);
  EXPECT_TRUE(Has(no_fill, "1.25x: a first write into a fresh 4 KiB subcluster past the end"));
  EXPECT_TRUE(Has(no_fill, "the other 262144 bytes are metadata"));

  // Reused space: the rest of each subcluster is filled.
  SeedPass reused = MakePass(1024, kMiB, 1000, 3 * kMiB);
  std::string fill = ExplainAmplification(0, 128 * 1024, true, reused);
  EXPECT_TRUE(Has(fill, "4.00x: the first write into each untouched 4 KiB subcluster"));
  EXPECT_TRUE(Has(fill, "(3145728 bytes so written)"));
  EXPECT_TRUE(Lacks(fill, "metadata"));

  // Without subclusters the fill is the whole cluster.
  std::string big = ExplainAmplification(0, 2 * 1024 * 1024, false, reused);
  EXPECT_TRUE(Has(big, "write the whole 2 MiB cluster"));
}

}  // namespace
}  // namespace thindisk::bench
