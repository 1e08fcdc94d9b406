#include "io/rados_header.h"

#include <gtest/gtest.h>

#include "util/endian.h"

namespace thindisk::io {
namespace {

TEST(RadosHeaderCodec, RoundTrip) {
  RadosHeader h;
  h.object_order = 16;
  h.size = (5ull << 30) + 123;
  h.data_limit = 64ull << 16;
  h.compatible_features = 0x5;
  const std::vector<uint8_t> b = h.Encode();
  ASSERT_EQ(b.size(), RadosHeader::kEncodedSize);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "TDRADOS\n");
  EXPECT_EQ(LoadBe32(&b[8]), 1u);
  auto d = RadosHeader::Decode(b, "rados://p/i");
  ASSERT_TRUE(d) << d.status().ToString();
  EXPECT_EQ(d->object_order, 16u);
  EXPECT_EQ(d->object_size(), 65536u);
  EXPECT_EQ(d->size, h.size);
  EXPECT_EQ(d->data_limit, h.data_limit);
  EXPECT_EQ(d->compatible_features,
            0x5u);  // unknown compatible bits are kept, not refused
}

TEST(RadosHeaderCodec, LongerObjectOfVersionOneDecodes) {
  std::vector<uint8_t> b = RadosHeader{}.Encode();
  b.resize(200, 0xee);  // a later version's appended fields
  EXPECT_TRUE(RadosHeader::Decode(b, "rados://p/i"));
}

Status DecodeError(const std::vector<uint8_t>& b) {
  return RadosHeader::Decode(b, "rados://p/i").status();
}

TEST(RadosHeaderCodec, Refusals) {
  const std::vector<uint8_t> good = RadosHeader{}.Encode();
  auto with = [&](size_t at, auto store, uint64_t v) {
    std::vector<uint8_t> b = good;
    store(&b[at], v);
    return b;
  };
  auto be32 = [](uint8_t* p, uint64_t v) { StoreBe32(p, uint32_t(v)); };
  auto be64 = [](uint8_t* p, uint64_t v) { StoreBe64(p, v); };

  Status s = DecodeError({'Q', 'F', 'I', 0xfb, 0, 0, 0, 3});
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find("rados://p/i: not a thindisk image"), std::string::npos)
      << s.message();
  EXPECT_EQ(DecodeError({}).code(), Code::kCorrupt);

  s = DecodeError(with(8, be32, 2));
  EXPECT_EQ(s.code(), Code::kNotSupported);
  EXPECT_NE(s.message().find("newer thindisk (header version 2"), std::string::npos)
      << s.message();

  s = DecodeError(std::vector<uint8_t>(good.begin(), good.begin() + 40));
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find("is 40 bytes"), std::string::npos) << s.message();

  EXPECT_EQ(DecodeError(with(8, be32, 0)).code(), Code::kCorrupt);
  EXPECT_EQ(DecodeError(with(12, be32, 11)).code(), Code::kCorrupt);  // 2 KiB objects
  EXPECT_EQ(DecodeError(with(12, be32, 28)).code(), Code::kCorrupt);  // 256 MiB objects
  EXPECT_EQ(DecodeError(with(16, be64, (1ull << 62) + 1)).code(), Code::kCorrupt);
  EXPECT_EQ(DecodeError(with(24, be64, 4096)).code(),
            Code::kCorrupt);  // not object-aligned

  s = DecodeError(with(32, be64, 0x10));
  EXPECT_EQ(s.code(), Code::kNotSupported);
  EXPECT_NE(s.message().find("0x10"), std::string::npos) << s.message();
}

TEST(RadosHeaderCodec, ObjectOrder) {
  EXPECT_EQ(*RadosObjectOrder(4096, "x"), 12u);
  EXPECT_EQ(*RadosObjectOrder(4 << 20, "x"), 22u);
  EXPECT_EQ(*RadosObjectOrder(128 << 20, "x"), 27u);
  for (uint64_t bad : {0ull, 2048ull, 4097ull, 3ull << 20, 256ull << 20}) {
    auto o = RadosObjectOrder(bad, "rados://p/i");
    ASSERT_FALSE(o) << bad;
    EXPECT_EQ(o.status().code(), Code::kInvalidArgument);
    EXPECT_NE(o.status().message().find("rados://p/i: object size"), std::string::npos);
  }
}

}  // namespace
}  // namespace thindisk::io
