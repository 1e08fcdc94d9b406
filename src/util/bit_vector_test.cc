#include "util/bit_vector.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace thindisk {
namespace {

TEST(BitVectorTest, RangesAcrossWords) {
  BitVector v(200);
  v.SetRange(60, 10);  // 60..69 crosses the first word
  EXPECT_FALSE(v.Test(59));
  EXPECT_TRUE(v.Test(60));
  EXPECT_TRUE(v.Test(69));
  EXPECT_FALSE(v.Test(70));
  EXPECT_EQ(v.CountSet(), 10u);
  EXPECT_TRUE(v.AllSet(60, 10));
  EXPECT_FALSE(v.AllSet(59, 10));
  EXPECT_EQ(v.NextSet(0), 60u);
  EXPECT_EQ(v.NextClear(60), 70u);
  EXPECT_EQ(v.NextSet(70), 200u);  // none: size()
  v.ClearRange(62, 3);
  EXPECT_EQ(v.CountSet(), 7u);
  EXPECT_EQ(v.NextClear(60), 62u);
}

TEST(BitVectorTest, RangesAreClippedToTheSize) {
  BitVector v(70);
  v.SetRange(65, 1000);
  EXPECT_EQ(v.CountSet(), 5u);
  v.SetRange(500, 3);  // wholly past the end: nothing
  EXPECT_EQ(v.CountSet(), 5u);
  EXPECT_TRUE(v.AllSet(65, 1000));
  EXPECT_EQ(v.NextClear(65), 70u);
}

TEST(BitVectorTest, ByteLayoutIsLeastSignificantBitFirst) {
  // qcow2 bitmap data: bit i is bit i % 8 of byte i / 8.
  BitVector v(20);
  v.SetRange(0, 1);
  v.SetRange(9, 1);
  v.SetRange(19, 1);
  std::vector<uint8_t> bytes(4, 0xee);
  v.ReadBytes(0, bytes);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{0x01, 0x02, 0x08, 0x00}));  // past the end: zeros
  BitVector w(20);
  w.WriteBytes(0, bytes);
  EXPECT_EQ(w, v);
}

TEST(BitVectorTest, WriteBytesKeepsTheTailClear) {
  BitVector v(12);
  std::vector<uint8_t> ones(2, 0xff);
  v.WriteBytes(0, ones);
  EXPECT_EQ(v.CountSet(), 12u);
  std::vector<uint8_t> out(2);
  v.ReadBytes(0, out);
  EXPECT_EQ(out[1], 0x0f);  // tail bits past the size stay zero
}

TEST(BitVectorTest, ResizeAndOr) {
  BitVector a(100), b(300);
  a.SetRange(90, 10);
  b.SetRange(0, 300);
  a.Or(b);
  EXPECT_EQ(a.CountSet(), 100u);
  a.Resize(40);
  EXPECT_EQ(a.CountSet(), 40u);
  a.Resize(130);
  EXPECT_EQ(a.CountSet(), 40u);  // grown bits are clear
  EXPECT_EQ(a.NextClear(0), 40u);
}

TEST(BitVectorTest, MatchesASimpleModel) {
  std::mt19937_64 rng(7);
  BitVector v(1000);
  std::vector<bool> model(1000);
  for (int i = 0; i < 2000; ++i) {
    uint64_t first = rng() % 1000, count = rng() % 150;
    bool set = rng() % 2;
    if (set) v.SetRange(first, count); else v.ClearRange(first, count);
    for (uint64_t k = first; k < std::min<uint64_t>(1000, first + count); ++k) model[k] = set;
  }
  uint64_t n = 0;
  for (uint64_t k = 0; k < 1000; ++k) {
    ASSERT_EQ(v.Test(k), model[k]) << k;
    n += model[k];
  }
  EXPECT_EQ(v.CountSet(), n);
  for (uint64_t from = 0; from < 1000; from += 37) {
    uint64_t s = from;
    while (s < 1000 && !model[s]) ++s;
    EXPECT_EQ(v.NextSet(from), s);
  }
}

}  // namespace
}  // namespace thindisk
