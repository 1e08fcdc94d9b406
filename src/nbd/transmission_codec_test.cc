#include "nbd/transmission_codec.h"

#include <gtest/gtest.h>

#include "util/endian.h"

namespace thindisk::nbd {
namespace {

std::vector<uint8_t> RequestBytes(uint16_t flags, uint16_t type, uint64_t handle,
                                  uint64_t offset, uint32_t length) {
  std::vector<uint8_t> b(kRequestHeaderSize);
  StoreBe32(b.data(), kRequestMagic);
  StoreBe16(b.data() + 4, flags);
  StoreBe16(b.data() + 6, type);
  StoreBe64(b.data() + 8, handle);
  StoreBe64(b.data() + 16, offset);
  StoreBe32(b.data() + 24, length);
  return b;
}

Request Req(uint16_t type, uint64_t offset, uint32_t length, uint16_t flags = 0) {
  return Request{flags, type, 1, offset, length};
}

// A writable export of 1 MiB with structured replies and one context.
RequestContext Ctx(bool read_only = false) {
  RequestContext c;
  c.export_size = 1 << 20;
  c.read_only = read_only;
  c.structured_replies = true;
  c.transmission_flags = TransmissionFlags(read_only, true);
  c.has_meta_contexts = true;
  return c;
}

TEST(TransmissionCodec, DecodeRequestIncrementally) {
  auto bytes = RequestBytes(kCmdFlagFua, kCmdWrite, 0x1122334455667788ULL, 4096, 512);
  for (size_t n = 0; n < kRequestHeaderSize; ++n) {
    auto r = DecodeRequest(std::span(bytes).first(n));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->need, kRequestHeaderSize);
  }
  auto r = DecodeRequest(bytes);
  ASSERT_TRUE(r.has_value() && r->complete());
  EXPECT_EQ(r->consumed, kRequestHeaderSize);
  EXPECT_EQ(r->message->flags, kCmdFlagFua);
  EXPECT_EQ(r->message->type, kCmdWrite);
  EXPECT_EQ(r->message->handle, 0x1122334455667788ULL);
  EXPECT_EQ(r->message->offset, 4096u);
  EXPECT_EQ(r->message->length, 512u);
  EXPECT_EQ(WirePayloadLength(*r->message), 512u);
  EXPECT_EQ(WirePayloadLength(Req(kCmdRead, 0, 512)), 0u);
}

TEST(TransmissionCodec, BadRequestMagic) {
  auto bytes = RequestBytes(0, kCmdRead, 1, 0, 512);
  bytes[3] ^= 1;
  EXPECT_EQ(DecodeRequest(bytes).status().code(), Code::kCorrupt);
}

TEST(TransmissionCodec, ValidRequests) {
  const RequestContext c = Ctx();
  EXPECT_TRUE(ValidateRequest(Req(kCmdRead, 0, 4096), c).ok());
  EXPECT_TRUE(ValidateRequest(Req(kCmdRead, 0, 4096, kCmdFlagDf | kCmdFlagFua), c).ok());
  EXPECT_TRUE(ValidateRequest(Req(kCmdWrite, (1 << 20) - 1, 1, kCmdFlagFua), c).ok());
  EXPECT_TRUE(ValidateRequest(Req(kCmdFlush, 0, 0), c).ok());
  EXPECT_TRUE(ValidateRequest(Req(kCmdTrim, 0, 1 << 20, kCmdFlagFua), c).ok());
  EXPECT_TRUE(ValidateRequest(Req(kCmdCache, 0, 1 << 20), c).ok());
  EXPECT_TRUE(ValidateRequest(Req(kCmdWriteZeroes, 0, 1 << 20,
                                  kCmdFlagNoHole | kCmdFlagFastZero | kCmdFlagFua),
                              c)
                  .ok());
  EXPECT_TRUE(ValidateRequest(Req(kCmdBlockStatus, 0, 1 << 20, kCmdFlagReqOne), c).ok());
  EXPECT_TRUE(ValidateRequest(Req(kCmdDisc, 0, 0), c).ok());
}

TEST(TransmissionCodec, UnknownCommandAndFlags) {
  const RequestContext c = Ctx();
  EXPECT_EQ(ValidateRequest(Req(9, 0, 512), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdRead, 0, 512, kCmdFlagNoHole), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdWrite, 0, 512, kCmdFlagDf), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdWrite, 0, 512, 1 << 12), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdBlockStatus, 0, 512, kCmdFlagFastZero), c).error,
            kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdTrim, 0, 512, kCmdFlagReqOne), c).error, kEinval);
  // DF needs structured replies (SEND_DF is only advertised with them).
  RequestContext simple = c;
  simple.structured_replies = false;
  simple.transmission_flags = TransmissionFlags(false, false);
  EXPECT_EQ(ValidateRequest(Req(kCmdRead, 0, 512, kCmdFlagDf), simple).error, kEinval);
  // FUA needs SEND_FUA.
  RequestContext no_fua = c;
  no_fua.transmission_flags &= uint16_t(~kFlagSendFua);
  EXPECT_EQ(ValidateRequest(Req(kCmdWrite, 0, 512, kCmdFlagFua), no_fua).error, kEinval);
}

TEST(TransmissionCodec, ReadOnlyExportRefusesWritesWithEperm) {
  const RequestContext c = Ctx(/*read_only=*/true);
  EXPECT_EQ(ValidateRequest(Req(kCmdWrite, 0, 512), c).error, kEperm);
  EXPECT_EQ(ValidateRequest(Req(kCmdTrim, 0, 512), c).error, kEperm);
  EXPECT_EQ(ValidateRequest(Req(kCmdWriteZeroes, 0, 512), c).error, kEperm);
  // Even past the end: permission is decided first.
  EXPECT_EQ(ValidateRequest(Req(kCmdWrite, 1 << 20, 512), c).error, kEperm);
  EXPECT_TRUE(ValidateRequest(Req(kCmdRead, 0, 512), c).ok());
  EXPECT_TRUE(ValidateRequest(Req(kCmdFlush, 0, 0), c).ok());
}

TEST(TransmissionCodec, CommandsNeedNegotiation) {
  RequestContext c = Ctx();
  c.has_meta_contexts = false;
  EXPECT_EQ(ValidateRequest(Req(kCmdBlockStatus, 0, 512), c).error, kEinval);
  c.transmission_flags = kFlagHasFlags;
  EXPECT_EQ(ValidateRequest(Req(kCmdFlush, 0, 0), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdTrim, 0, 512), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdWriteZeroes, 0, 512), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdCache, 0, 512), c).error, kEinval);
  EXPECT_EQ(
      ValidateRequest(Req(kCmdWriteZeroes, 0, 512, kCmdFlagFastZero), Ctx(true)).error,
      kEinval);  // FAST_ZERO not advertised read-only
}

TEST(TransmissionCodec, LengthRules) {
  const RequestContext c = Ctx();
  EXPECT_EQ(ValidateRequest(Req(kCmdFlush, 0, 1), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdFlush, 1, 0), c).error, kEinval);
  for (uint16_t t :
       {kCmdRead, kCmdWrite, kCmdTrim, kCmdWriteZeroes, kCmdCache, kCmdBlockStatus})
    EXPECT_EQ(ValidateRequest(Req(t, 0, 0), c).error, kEinval) << CommandName(t);
  RequestContext big = c;
  big.export_size = 1ULL << 40;
  EXPECT_TRUE(ValidateRequest(Req(kCmdRead, 0, kMaxPayloadLength), big).ok());
  EXPECT_EQ(ValidateRequest(Req(kCmdRead, 0, kMaxPayloadLength + 1), big).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdWrite, 0, kMaxPayloadLength + 1), big).error,
            kEinval);
  // Non-payload commands may be longer.
  EXPECT_TRUE(ValidateRequest(Req(kCmdTrim, 0, 0xffffffffu), big).ok());
  EXPECT_TRUE(ValidateRequest(Req(kCmdBlockStatus, 0, 0xffffffffu), big).ok());
}

TEST(TransmissionCodec, BoundsWithoutOverflow) {
  const RequestContext c = Ctx();
  const uint64_t size = c.export_size;
  EXPECT_EQ(ValidateRequest(Req(kCmdRead, size - 511, 512), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdRead, size, 1), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdBlockStatus, size, 1), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdWrite, size - 1, 2), c).error, kEnospc);
  EXPECT_EQ(ValidateRequest(Req(kCmdTrim, size, 1), c).error, kEnospc);
  EXPECT_EQ(ValidateRequest(Req(kCmdWriteZeroes, size + 1, 1), c).error, kEnospc);
  // offset + length would wrap around 2^64.
  EXPECT_EQ(ValidateRequest(Req(kCmdRead, ~0ULL - 10, 512), c).error, kEinval);
  EXPECT_EQ(ValidateRequest(Req(kCmdWrite, ~0ULL, 512), c).error, kEnospc);
}

TEST(TransmissionCodec, StatusToNbdErrorInOnePlace) {
  EXPECT_EQ(NbdErrorFromStatus(Status::Ok()), 0u);
  EXPECT_EQ(NbdErrorFromStatus(Status(Code::kNoSpace, "full")), kEnospc);
  EXPECT_EQ(NbdErrorFromStatus(Status::ReadOnly("ro")), kEperm);
  EXPECT_EQ(NbdErrorFromStatus(Status::InvalidArgument("x")), kEinval);
  EXPECT_EQ(NbdErrorFromStatus(Status::OutOfRange("x")), kEinval);
  EXPECT_EQ(NbdErrorFromStatus(Status::NotSupported("x")), kEnotsup);
  for (Code code :
       {Code::kNotFound, Code::kCorrupt, Code::kIoError, Code::kBusy, Code::kInternal})
    EXPECT_EQ(NbdErrorFromStatus(Status(code, "x")), kEio) << CodeName(code);
}

TEST(TransmissionCodec, TransmissionFlagsFollowExport) {
  const uint16_t rw = TransmissionFlags(false, true);
  for (uint16_t f :
       {kFlagHasFlags, kFlagSendFlush, kFlagSendFua, kFlagSendTrim, kFlagSendWriteZeroes,
        kFlagSendDf, kFlagCanMultiConn, kFlagSendCache, kFlagSendFastZero})
    EXPECT_TRUE(rw & f) << f;
  EXPECT_FALSE(rw & kFlagReadOnly);
  EXPECT_FALSE(TransmissionFlags(false, false) & kFlagSendDf);
  const uint16_t ro = TransmissionFlags(true, true);
  EXPECT_TRUE(ro & kFlagReadOnly);
  EXPECT_FALSE(ro & kFlagSendTrim);
  EXPECT_FALSE(ro & kFlagSendWriteZeroes);
}

TEST(TransmissionCodec, SimpleReplyAndChunkHeaders) {
  SimpleReplyHeader s = EncodeSimpleReply(42, kEperm);
  EXPECT_EQ(LoadBe32(s.data()), kSimpleReplyMagic);
  EXPECT_EQ(LoadBe32(s.data() + 4), kEperm);
  EXPECT_EQ(LoadBe64(s.data() + 8), 42u);

  ChunkHeader n = EncodeNoneChunk(7);
  EXPECT_EQ(LoadBe32(n.data()), kStructuredReplyMagic);
  EXPECT_EQ(LoadBe16(n.data() + 4), kReplyFlagDone);
  EXPECT_EQ(LoadBe16(n.data() + 6), kReplyTypeNone);
  EXPECT_EQ(LoadBe64(n.data() + 8), 7u);
  EXPECT_EQ(LoadBe32(n.data() + 16), 0u);

  auto d = EncodeOffsetDataHeader(0, 9, 65536, 4096);
  EXPECT_EQ(LoadBe16(d.data() + 6), kReplyTypeOffsetData);
  EXPECT_EQ(LoadBe32(d.data() + 16), 4096u + 8);
  EXPECT_EQ(LoadBe64(d.data() + 20), 65536u);

  auto h = EncodeOffsetHole(kReplyFlagDone, 9, 8192, 512);
  EXPECT_EQ(LoadBe16(h.data() + 4), kReplyFlagDone);
  EXPECT_EQ(LoadBe16(h.data() + 6), kReplyTypeOffsetHole);
  EXPECT_EQ(LoadBe32(h.data() + 16), 12u);
  EXPECT_EQ(LoadBe64(h.data() + 20), 8192u);
  EXPECT_EQ(LoadBe32(h.data() + 28), 512u);
}

TEST(TransmissionCodec, BlockStatusChunk) {
  std::vector<BlockDescriptor> ds = {{4096, 0}, {8192, kStateHole | kStateZero}};
  auto b = EncodeBlockStatus(kReplyFlagDone, 3, 1, ds);
  ASSERT_EQ(b.size(), kChunkHeaderSize + 4 + 16);
  EXPECT_EQ(LoadBe16(b.data() + 6), kReplyTypeBlockStatus);
  EXPECT_EQ(LoadBe32(b.data() + 16), 20u);
  EXPECT_EQ(LoadBe32(b.data() + 20), 1u);
  EXPECT_EQ(LoadBe32(b.data() + 24), 4096u);
  EXPECT_EQ(LoadBe32(b.data() + 28), 0u);
  EXPECT_EQ(LoadBe32(b.data() + 32), 8192u);
  EXPECT_EQ(LoadBe32(b.data() + 36), kStateHole | kStateZero);
}

TEST(TransmissionCodec, ErrorChunk) {
  auto e = EncodeErrorChunk(kReplyFlagDone, 5, kEio, "disk on fire");
  EXPECT_EQ(LoadBe16(e.data() + 6), kReplyTypeError);
  EXPECT_EQ(LoadBe32(e.data() + 16), 6u + 12);
  EXPECT_EQ(LoadBe32(e.data() + 20), kEio);
  EXPECT_EQ(LoadBe16(e.data() + 24), 12u);
  EXPECT_EQ(std::string(e.begin() + 26, e.end()), "disk on fire");
  auto big = EncodeErrorChunk(kReplyFlagDone, 5, kEio, std::string(70000, 'm'));
  EXPECT_EQ(LoadBe16(big.data() + 24), kMaxStringLength);
  EXPECT_EQ(big.size(), kChunkHeaderSize + 6 + kMaxStringLength);
}

}  // namespace
}  // namespace thindisk::nbd
