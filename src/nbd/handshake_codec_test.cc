#include "nbd/handshake_codec.h"

#include <gtest/gtest.h>

#include <random>

#include "util/endian.h"

namespace thindisk::nbd {
namespace {

void Put32(Bytes* b, uint32_t v) {
  uint8_t x[4];
  StoreBe32(x, v);
  b->insert(b->end(), x, x + 4);
}
void Put16(Bytes* b, uint16_t v) {
  uint8_t x[2];
  StoreBe16(x, v);
  b->insert(b->end(), x, x + 2);
}
void PutStr(Bytes* b, const std::string& s) { b->insert(b->end(), s.begin(), s.end()); }

// IHAVEOPT, option, length, data.
Bytes OptionBytes(uint32_t code, const Bytes& data) {
  Bytes b(8);
  StoreBe64(b.data(), kIHaveOpt);
  Put32(&b, code);
  Put32(&b, uint32_t(data.size()));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes InfoData(const std::string& name, std::vector<uint16_t> requests) {
  Bytes d;
  Put32(&d, uint32_t(name.size()));
  PutStr(&d, name);
  Put16(&d, uint16_t(requests.size()));
  for (uint16_t r : requests) Put16(&d, r);
  return d;
}

Bytes MetaData(const std::string& name, const std::vector<std::string>& queries) {
  Bytes d;
  Put32(&d, uint32_t(name.size()));
  PutStr(&d, name);
  Put32(&d, uint32_t(queries.size()));
  for (const auto& q : queries) {
    Put32(&d, uint32_t(q.size()));
    PutStr(&d, q);
  }
  return d;
}

Option DecodeWhole(const Bytes& bytes) {
  auto r = DecodeOption(bytes);
  EXPECT_TRUE(r.has_value()) << r.status().ToString();
  EXPECT_TRUE(r->complete());
  EXPECT_EQ(r->consumed, bytes.size());
  return *r->message;
}

TEST(HandshakeCodec, GreetingIsNewstyleWithFixedAndNoZeroes) {
  Bytes g = EncodeGreeting();
  ASSERT_EQ(g.size(), kGreetingSize);
  EXPECT_EQ(std::string(g.begin(), g.begin() + 8), "NBDMAGIC");
  EXPECT_EQ(std::string(g.begin() + 8, g.begin() + 16), "IHAVEOPT");
  EXPECT_EQ(LoadBe16(g.data() + 16), kFlagFixedNewstyle | kFlagNoZeroes);
}

TEST(HandshakeCodec, ClientFlags) {
  Bytes b;
  EXPECT_EQ(DecodeClientFlags(b)->need, 4u);
  Put32(&b, kFlagCFixedNewstyle | kFlagCNoZeroes);
  EXPECT_EQ(DecodeClientFlags(std::span(b).first(3))->need, 4u);
  auto d = DecodeClientFlags(b);
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->message->fixed_newstyle);
  EXPECT_TRUE(d->message->no_zeroes);
  EXPECT_EQ(d->consumed, 4u);
  Bytes bad;
  Put32(&bad, 1u << 2);  // never advertised
  EXPECT_EQ(DecodeClientFlags(bad).status().code(), Code::kInvalidArgument);
}

TEST(HandshakeCodec, OptionNeedsHeaderThenPayload) {
  Bytes whole = OptionBytes(kOptGo, InfoData("disk", {kInfoName}));
  for (size_t n = 0; n < kOptionHeaderSize; ++n) {
    auto r = DecodeOption(std::span(whole).first(n));
    ASSERT_TRUE(r.has_value());
    EXPECT_FALSE(r->complete());
    EXPECT_EQ(r->need, kOptionHeaderSize);
  }
  for (size_t n = kOptionHeaderSize; n < whole.size(); ++n) {
    auto r = DecodeOption(std::span(whole).first(n));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->need, whole.size());
  }
  // Extra bytes after the option are left alone.
  Bytes more = whole;
  more.push_back(0xaa);
  EXPECT_EQ(DecodeOption(more)->consumed, whole.size());
}

TEST(HandshakeCodec, BadMagicIsAStreamError) {
  Bytes b = OptionBytes(kOptList, {});
  b[0] ^= 0xff;
  EXPECT_EQ(DecodeOption(b).status().code(), Code::kCorrupt);
  // An oldstyle-looking client gets the same.
  Bytes old(16, 0);
  StoreBe64(old.data(), kInitPasswd);
  EXPECT_FALSE(DecodeOption(old).has_value());
}

TEST(HandshakeCodec, OversizeLengthRejectedOnTheHeaderAlone) {
  Bytes header(8);
  StoreBe64(header.data(), kIHaveOpt);
  Put32(&header, kOptGo);
  Put32(&header, kMaxOptionLength + 1);
  auto r = DecodeOption(header);  // no payload present at all
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kOutOfRange);
  Bytes huge(8);
  StoreBe64(huge.data(), kIHaveOpt);
  Put32(&huge, kOptExportName);
  Put32(&huge, 0xffffffffu);
  EXPECT_EQ(DecodeOption(huge).status().code(), Code::kOutOfRange);
  // Exactly the limit is framed (and waits for its payload).
  StoreBe32(header.data() + 12, kMaxOptionLength);
  EXPECT_EQ(DecodeOption(header)->need, kOptionHeaderSize + kMaxOptionLength);
}

TEST(HandshakeCodec, ExportName) {
  Bytes d;
  PutStr(&d, "vm-disk");
  Option o = DecodeWhole(OptionBytes(kOptExportName, d));
  EXPECT_EQ(o.code, kOptExportName);
  EXPECT_TRUE(o.payload_status.ok());
  EXPECT_EQ(o.export_name, "vm-disk");
  Option empty = DecodeWhole(OptionBytes(kOptExportName, {}));
  EXPECT_TRUE(empty.payload_status.ok());
  EXPECT_EQ(empty.export_name, "");
  Bytes nul = {'a', 0, 'b'};
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptExportName, nul)).payload_status.ok());
  Bytes long_name(kMaxStringLength + 1, 'x');
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptExportName, long_name)).payload_status.ok());
}

TEST(HandshakeCodec, GoAndInfoWithRequests) {
  for (uint32_t code : {kOptGo, kOptInfo}) {
    Option o = DecodeWhole(OptionBytes(code, InfoData("x", {kInfoName, kInfoBlockSize})));
    EXPECT_TRUE(o.payload_status.ok());
    EXPECT_EQ(o.export_name, "x");
    EXPECT_EQ(o.info_requests, (std::vector<uint16_t>{kInfoName, kInfoBlockSize}));
  }
  Option none = DecodeWhole(OptionBytes(kOptGo, InfoData("", {})));
  EXPECT_TRUE(none.payload_status.ok());
  EXPECT_TRUE(none.info_requests.empty());
}

TEST(HandshakeCodec, MalformedGoIsInvalidButFramed) {
  // Name length larger than the option.
  Bytes d;
  Put32(&d, 100);
  PutStr(&d, "ab");
  Put16(&d, 0);
  Option o = DecodeWhole(OptionBytes(kOptGo, d));
  EXPECT_EQ(o.payload_status.code(), Code::kInvalidArgument);
  // Request count that does not match the length.
  Bytes c = InfoData("ab", {kInfoName});
  c.push_back(0);
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptGo, c)).payload_status.ok());
  Bytes c2 = InfoData("ab", {kInfoName});
  StoreBe16(c2.data() + 6, 5);
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptInfo, c2)).payload_status.ok());
  // Truncated before the count.
  Bytes t;
  Put32(&t, 0);
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptGo, t)).payload_status.ok());
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptGo, {})).payload_status.ok());
}

TEST(HandshakeCodec, OptionsWithoutData) {
  EXPECT_TRUE(DecodeWhole(OptionBytes(kOptList, {})).payload_status.ok());
  EXPECT_TRUE(DecodeWhole(OptionBytes(kOptStructuredReply, {})).payload_status.ok());
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptList, {1})).payload_status.ok());
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptStructuredReply, {1, 2})).payload_status.ok());
  EXPECT_TRUE(DecodeWhole(OptionBytes(kOptAbort, {})).payload_status.ok());
}

TEST(HandshakeCodec, UnknownOptionDecodes) {
  Option o = DecodeWhole(OptionBytes(0x1234, {1, 2, 3}));
  EXPECT_EQ(o.code, 0x1234u);
  EXPECT_EQ(o.length, 3u);
  EXPECT_TRUE(o.payload_status.ok());
  EXPECT_EQ(OptionName(0x1234), "unknown");
  EXPECT_EQ(OptionName(kOptGo), "NBD_OPT_GO");
}

TEST(HandshakeCodec, MetaContextQueries) {
  for (uint32_t code : {kOptListMetaContext, kOptSetMetaContext}) {
    Option o = DecodeWhole(OptionBytes(
        code, MetaData("disk", {kContextBaseAllocation, kContextAllocationDepth})));
    EXPECT_TRUE(o.payload_status.ok()) << o.payload_status.ToString();
    EXPECT_EQ(o.export_name, "disk");
    EXPECT_EQ(o.queries, (std::vector<std::string>{kContextBaseAllocation,
                                                   kContextAllocationDepth}));
  }
  Option none = DecodeWhole(OptionBytes(kOptListMetaContext, MetaData("", {})));
  EXPECT_TRUE(none.payload_status.ok());
  EXPECT_TRUE(none.queries.empty());
}

TEST(HandshakeCodec, MalformedMetaContext) {
  // A hostile query count is refused without looping over it.
  Bytes d;
  Put32(&d, 0);
  Put32(&d, 0xffffffffu);
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptSetMetaContext, d)).payload_status.ok());
  // A query length past the end.
  Bytes q;
  Put32(&q, 0);
  Put32(&q, 1);
  Put32(&q, 50);
  PutStr(&q, "base:");
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptSetMetaContext, q)).payload_status.ok());
  // Trailing garbage.
  Bytes t = MetaData("", {"base:allocation"});
  t.push_back(7);
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptListMetaContext, t)).payload_status.ok());
  // Truncated before the count.
  Bytes n;
  Put32(&n, 0);
  EXPECT_FALSE(DecodeWhole(OptionBytes(kOptListMetaContext, n)).payload_status.ok());
}

TEST(HandshakeCodec, OptionReplyLayout) {
  Bytes r = EncodeOptionReply(kOptList, kRepAck);
  ASSERT_EQ(r.size(), kOptionReplyHeaderSize);
  EXPECT_EQ(LoadBe64(r.data()), kOptReplyMagic);
  EXPECT_EQ(LoadBe32(r.data() + 8), kOptList);
  EXPECT_EQ(LoadBe32(r.data() + 12), kRepAck);
  EXPECT_EQ(LoadBe32(r.data() + 16), 0u);

  Bytes e = EncodeOptionError(99, kRepErrUnsup, "nope");
  EXPECT_EQ(LoadBe32(e.data() + 12), kRepErrUnsup);
  EXPECT_EQ(LoadBe32(e.data() + 16), 4u);
  EXPECT_EQ(std::string(e.begin() + 20, e.end()), "nope");
  Bytes long_error = EncodeOptionError(1, kRepErrInvalid, std::string(10000, 'x'));
  EXPECT_EQ(LoadBe32(long_error.data() + 16), kMaxStringLength);
}

TEST(HandshakeCodec, RepServerAndMetaContext) {
  Bytes s = EncodeRepServer(kOptList, "disk", "a test disk");
  EXPECT_EQ(LoadBe32(s.data() + 12), kRepServer);
  EXPECT_EQ(LoadBe32(s.data() + 16), 4u + 4 + 11);
  EXPECT_EQ(LoadBe32(s.data() + 20), 4u);
  EXPECT_EQ(std::string(s.begin() + 24, s.begin() + 28), "disk");
  EXPECT_EQ(std::string(s.begin() + 28, s.end()), "a test disk");

  Bytes m = EncodeRepMetaContext(kOptSetMetaContext, 7, kContextBaseAllocation);
  EXPECT_EQ(LoadBe32(m.data() + 12), kRepMetaContext);
  EXPECT_EQ(LoadBe32(m.data() + 20), 7u);
  EXPECT_EQ(std::string(m.begin() + 24, m.end()), "base:allocation");
}

TEST(HandshakeCodec, RepInfoPayloads) {
  Bytes e = EncodeInfoExport(kOptGo, 1ULL << 40, 0x1234);
  EXPECT_EQ(LoadBe32(e.data() + 12), kRepInfo);
  EXPECT_EQ(LoadBe32(e.data() + 16), 12u);
  EXPECT_EQ(LoadBe16(e.data() + 20), kInfoExport);
  EXPECT_EQ(LoadBe64(e.data() + 22), 1ULL << 40);
  EXPECT_EQ(LoadBe16(e.data() + 30), 0x1234);

  Bytes n = EncodeInfoName(kOptInfo, "nm");
  EXPECT_EQ(LoadBe16(n.data() + 20), kInfoName);
  EXPECT_EQ(std::string(n.begin() + 22, n.end()), "nm");
  Bytes d = EncodeInfoDescription(kOptInfo, "desc");
  EXPECT_EQ(LoadBe16(d.data() + 20), kInfoDescription);
  EXPECT_EQ(std::string(d.begin() + 22, d.end()), "desc");

  Bytes b = EncodeInfoBlockSize(kOptGo, 1, 4096, kMaxPayloadLength);
  EXPECT_EQ(LoadBe32(b.data() + 16), 14u);
  EXPECT_EQ(LoadBe16(b.data() + 20), kInfoBlockSize);
  EXPECT_EQ(LoadBe32(b.data() + 22), 1u);
  EXPECT_EQ(LoadBe32(b.data() + 26), 4096u);
  EXPECT_EQ(LoadBe32(b.data() + 30), kMaxPayloadLength);
}

TEST(HandshakeCodec, ExportNameReplyHonoursNoZeroes) {
  Bytes z = EncodeExportNameReply(12345, kFlagHasFlags, /*no_zeroes=*/false);
  ASSERT_EQ(z.size(), 10u + kExportNameReplyZeroes);
  EXPECT_EQ(LoadBe64(z.data()), 12345u);
  EXPECT_EQ(LoadBe16(z.data() + 8), kFlagHasFlags);
  EXPECT_TRUE(std::all_of(z.begin() + 10, z.end(), [](uint8_t c) { return c == 0; }));
  EXPECT_EQ(EncodeExportNameReply(1, kFlagHasFlags, /*no_zeroes=*/true).size(), 10u);
}

// Random bytes, mutated valid options, every prefix: the decoder answers
// need-more, a framing error, or an option whose payload status explains
// itself; it never reads out of bounds (run under ASan) or asks for more
// than the header allows.
TEST(HandshakeCodec, SurvivesRandomAndMutatedInput) {
  std::mt19937 rng(20261129);
  const std::vector<Bytes> seeds = {
      OptionBytes(kOptGo, InfoData("disk", {kInfoName, kInfoBlockSize})),
      OptionBytes(kOptSetMetaContext, MetaData("disk", {kContextBaseAllocation})),
      OptionBytes(kOptExportName, {'a', 'b'}), OptionBytes(kOptList, {})};
  for (int i = 0; i < 20000; ++i) {
    Bytes b = seeds[rng() % seeds.size()];
    if (i % 2) {
      b.resize(rng() % 64);
      for (auto& x : b) x = uint8_t(rng());
      if (b.size() >= 8 && i % 4 == 1)
        StoreBe64(b.data(), kIHaveOpt);  // get past the magic
    } else {
      for (int m = 0; m < 3; ++m)
        b[8 + rng() % (b.size() - 8)] ^= uint8_t(1 << (rng() % 8));
    }
    auto r = DecodeOption(b);
    if (!r.has_value()) continue;
    if (!r->complete()) {
      EXPECT_GT(r->need, b.size());
      EXPECT_LE(r->need, kOptionHeaderSize + kMaxOptionLength);
      continue;
    }
    EXPECT_LE(r->consumed, b.size());
    const Option& o = *r->message;
    EXPECT_LE(o.export_name.size(), kMaxStringLength);
    if (!o.payload_status.ok()) {
      EXPECT_FALSE(o.payload_status.message().empty());
    }
  }
}

}  // namespace
}  // namespace thindisk::nbd
