#include "nbd/negotiation.h"

#include <gtest/gtest.h>

#include "nbd/testing/memory_device.h"
#include "nbd/testing/raw_client.h"
#include "nbd/transmission_codec.h"
#include "util/endian.h"

namespace thindisk::nbd {
namespace {

using testing::GoData;
using testing::MemoryDevice;
using testing::MetaContextData;

struct Reply {
  uint32_t option;
  uint32_t type;
  Bytes data;
};

// Splits a Step's bytes into option replies.
std::vector<Reply> Replies(const Bytes& b) {
  std::vector<Reply> out;
  size_t pos = 0;
  while (pos + kOptionReplyHeaderSize <= b.size()) {
    EXPECT_EQ(LoadBe64(b.data() + pos), kOptReplyMagic);
    Reply r{LoadBe32(b.data() + pos + 8), LoadBe32(b.data() + pos + 12), {}};
    const uint32_t len = LoadBe32(b.data() + pos + 16);
    r.data.assign(b.begin() + pos + 20, b.begin() + pos + 20 + len);
    out.push_back(std::move(r));
    pos += kOptionReplyHeaderSize + len;
  }
  EXPECT_EQ(pos, b.size());
  return out;
}

Option Opt(uint32_t code, Bytes data = {}) {
  Bytes b(16);
  StoreBe64(b.data(), kIHaveOpt);
  StoreBe32(b.data() + 8, code);
  StoreBe32(b.data() + 12, uint32_t(data.size()));
  b.insert(b.end(), data.begin(), data.end());
  return *DecodeOption(b)->message;
}

class NegotiationTest : public ::testing::Test {
 protected:
  NegotiationTest() {
    exports_.push_back(
        {"disk", "the disk", std::make_shared<MemoryDevice>(1 << 20), false});
    exports_.push_back({"ro", "", std::make_shared<MemoryDevice>(8192), true});
  }
  Negotiator Make(bool no_zeroes = false) {
    return Negotiator(&exports_, ClientFlags{true, no_zeroes}, &shutting_down_);
  }
  std::vector<Export> exports_;
  std::atomic<bool> shutting_down_{false};
};

TEST_F(NegotiationTest, ListNamesEveryExport) {
  Negotiator n = Make();
  auto step = n.Handle(Opt(kOptList));
  EXPECT_EQ(step.next, Negotiator::Next::kContinue);
  auto r = Replies(step.reply);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].type, kRepServer);
  EXPECT_EQ(LoadBe32(r[0].data.data()), 4u);
  EXPECT_EQ(std::string(r[0].data.begin() + 4, r[0].data.end()), "diskthe disk");
  EXPECT_EQ(r[1].type, kRepServer);
  EXPECT_EQ(r[2].type, kRepAck);
  EXPECT_EQ(Replies(n.Handle(Opt(kOptList, {1})).reply)[0].type, kRepErrInvalid);
}

TEST_F(NegotiationTest, GoSendsInfoAndEntersTransmission) {
  Negotiator n = Make();
  auto step = n.Handle(Opt(kOptGo, GoData("disk", {kInfoName, kInfoDescription})));
  EXPECT_EQ(step.next, Negotiator::Next::kTransmission);
  auto r = Replies(step.reply);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(LoadBe16(r[0].data.data()), kInfoExport);
  EXPECT_EQ(LoadBe64(r[0].data.data() + 2), 1u << 20);
  EXPECT_EQ(LoadBe16(r[0].data.data() + 10), TransmissionFlags(false, false));
  EXPECT_EQ(LoadBe16(r[1].data.data()), kInfoName);
  EXPECT_EQ(std::string(r[1].data.begin() + 2, r[1].data.end()), "disk");
  EXPECT_EQ(LoadBe16(r[2].data.data()), kInfoDescription);
  EXPECT_EQ(LoadBe16(r[3].data.data()), kInfoBlockSize);
  EXPECT_EQ(LoadBe32(r[3].data.data() + 2), 1u);
  EXPECT_EQ(LoadBe32(r[3].data.data() + 6), 4096u);
  EXPECT_EQ(LoadBe32(r[3].data.data() + 10), kMaxPayloadLength);
  EXPECT_EQ(r[4].type, kRepAck);
  EXPECT_EQ(n.chosen_export().name, "disk");
  EXPECT_FALSE(n.structured_replies());
}

TEST_F(NegotiationTest, InfoDoesNotEndNegotiationAndUnknownExportFails) {
  Negotiator n = Make();
  auto info = n.Handle(Opt(kOptInfo, GoData("ro")));
  EXPECT_EQ(info.next, Negotiator::Next::kContinue);
  EXPECT_TRUE(LoadBe16(Replies(info.reply)[0].data.data() + 10) & kFlagReadOnly);
  auto bad = n.Handle(Opt(kOptGo, GoData("nope")));
  EXPECT_EQ(bad.next, Negotiator::Next::kContinue);
  EXPECT_EQ(Replies(bad.reply)[0].type, kRepErrUnknown);
}

TEST_F(NegotiationTest, EmptyNamePicksTheFirstExport) {
  Negotiator n = Make();
  EXPECT_EQ(n.Handle(Opt(kOptGo, GoData(""))).next, Negotiator::Next::kTransmission);
  EXPECT_EQ(n.chosen_export().name, "disk");
}

TEST_F(NegotiationTest, ExportNameRepliesWithOrWithoutZeroes) {
  Bytes name = {'r', 'o'};
  Negotiator a = Make(false);
  auto step = a.Handle(Opt(kOptExportName, name));
  EXPECT_EQ(step.next, Negotiator::Next::kTransmission);
  ASSERT_EQ(step.reply.size(), 10u + 124);
  EXPECT_EQ(LoadBe64(step.reply.data()), 8192u);
  EXPECT_TRUE(LoadBe16(step.reply.data() + 8) & kFlagReadOnly);
  Negotiator b = Make(true);
  EXPECT_EQ(b.Handle(Opt(kOptExportName, name)).reply.size(), 10u);
  // An unknown export cannot be reported: the session ends.
  Negotiator c = Make();
  auto gone = c.Handle(Opt(kOptExportName, {'x'}));
  EXPECT_EQ(gone.next, Negotiator::Next::kClose);
  EXPECT_TRUE(gone.reply.empty());
}

TEST_F(NegotiationTest, StructuredRepliesAndMetaContexts) {
  Negotiator n = Make();
  // Meta contexts need structured replies first.
  auto early =
      n.Handle(Opt(kOptSetMetaContext, MetaContextData("disk", {"base:allocation"})));
  EXPECT_EQ(Replies(early.reply)[0].type, kRepErrInvalid);
  EXPECT_EQ(Replies(n.Handle(Opt(kOptStructuredReply)).reply)[0].type, kRepAck);
  // LIST with no query: every context, id 0.
  auto all =
      Replies(n.Handle(Opt(kOptListMetaContext, MetaContextData("disk", {}))).reply);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(std::string(all[0].data.begin() + 4, all[0].data.end()),
            kContextBaseAllocation);
  EXPECT_EQ(std::string(all[1].data.begin() + 4, all[1].data.end()),
            kContextAllocationDepth);
  EXPECT_EQ(LoadBe32(all[1].data.data()), 0u);
  // LIST by namespace.
  auto qemu = Replies(
      n.Handle(Opt(kOptListMetaContext, MetaContextData("disk", {"qemu:"}))).reply);
  ASSERT_EQ(qemu.size(), 2u);
  EXPECT_EQ(std::string(qemu[0].data.begin() + 4, qemu[0].data.end()),
            kContextAllocationDepth);
  // SET: exact names only, unknown ones silently not selected.
  auto set = Replies(
      n.Handle(Opt(kOptSetMetaContext,
                   MetaContextData("disk", {"base:allocation", "base:", "other:thing"})))
          .reply);
  ASSERT_EQ(set.size(), 2u);
  EXPECT_EQ(set[0].type, kRepMetaContext);
  EXPECT_EQ(LoadBe32(set[0].data.data()), kBaseAllocationContextId);
  EXPECT_EQ(set[1].type, kRepAck);
  EXPECT_EQ(n.Handle(Opt(kOptGo, GoData("disk"))).next, Negotiator::Next::kTransmission);
  EXPECT_TRUE(n.structured_replies());
  EXPECT_TRUE(n.meta_contexts().base_allocation);
  EXPECT_FALSE(n.meta_contexts().allocation_depth);
  EXPECT_TRUE(n.transmission_flags() & kFlagSendDf);
}

TEST_F(NegotiationTest, ContextsForAnotherExportAreDropped) {
  // SET for "ro" is accepted (the context is selected) ...
  auto select_for_ro = [this](Negotiator& n) {
    ASSERT_EQ(Replies(n.Handle(Opt(kOptStructuredReply)).reply)[0].type, kRepAck);
    auto set = Replies(
        n.Handle(Opt(kOptSetMetaContext, MetaContextData("ro", {kContextAllocationDepth})))
            .reply);
    ASSERT_EQ(set.size(), 2u);
    EXPECT_EQ(set[0].type, kRepMetaContext);
    EXPECT_EQ(LoadBe32(set[0].data.data()), kAllocationDepthContextId);
    EXPECT_EQ(set[1].type, kRepAck);
  };
  // ... and kept by a GO of that export (the control) ...
  Negotiator same = Make();
  select_for_ro(same);
  EXPECT_EQ(same.Handle(Opt(kOptGo, GoData("ro"))).next, Negotiator::Next::kTransmission);
  EXPECT_TRUE(same.meta_contexts().allocation_depth);
  // ... but dropped by a GO of another.
  Negotiator other = Make();
  select_for_ro(other);
  EXPECT_EQ(other.Handle(Opt(kOptGo, GoData("disk"))).next, Negotiator::Next::kTransmission);
  EXPECT_FALSE(other.meta_contexts().any());
}

TEST_F(NegotiationTest, UnsupportedAndUnknownOptions) {
  Negotiator n = Make();
  for (uint32_t code : {kOptStartTls, kOptExtendedHeaders, kOptPeekExport, 0xdeadu}) {
    auto step = n.Handle(Opt(code, {1, 2}));
    EXPECT_EQ(step.next, Negotiator::Next::kContinue);
    auto r = Replies(step.reply);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].option, code);
    EXPECT_EQ(r[0].type, kRepErrUnsup);
  }
}

// doc/proto.md "TLS support": with TLS required, nothing but STARTTLS and
// ABORT before TLS; EXPORT_NAME, which cannot carry an error, ends it.
TEST_F(NegotiationTest, TlsRequiredRefusesEverythingButStartTls) {
  const TlsPolicy required{/*offered=*/true, /*required=*/true, /*active=*/false};
  for (uint32_t code : {kOptList, kOptPeekExport, kOptInfo, kOptGo, kOptStructuredReply,
                        kOptListMetaContext, kOptSetMetaContext, kOptExtendedHeaders, 0xdeadu}) {
    Negotiator n(&exports_, ClientFlags{true, false}, &shutting_down_, required);
    const Bytes data = code == kOptGo || code == kOptInfo ? GoData("disk") : Bytes{};
    auto step = n.Handle(Opt(code, data));
    EXPECT_EQ(step.next, Negotiator::Next::kContinue) << code;
    auto r = Replies(step.reply);
    ASSERT_EQ(r.size(), 1u) << code;
    EXPECT_EQ(r[0].option, code);
    EXPECT_EQ(r[0].type, kRepErrTlsReqd) << code;
    EXPECT_FALSE(r[0].data.empty());  // a message for humans
  }
  Negotiator n(&exports_, ClientFlags{true, false}, &shutting_down_, required);
  auto name = n.Handle(Opt(kOptExportName, Bytes{'d', 'i', 's', 'k'}));
  EXPECT_EQ(name.next, Negotiator::Next::kClose);
  EXPECT_TRUE(name.reply.empty());  // no export data before TLS
  Negotiator a(&exports_, ClientFlags{true, false}, &shutting_down_, required);
  EXPECT_EQ(a.Handle(Opt(kOptAbort)).next, Negotiator::Next::kClose);
  Negotiator t(&exports_, ClientFlags{true, false}, &shutting_down_, required);
  auto start = t.Handle(Opt(kOptStartTls));
  EXPECT_EQ(start.next, Negotiator::Next::kStartTls);
  auto r = Replies(start.reply);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].type, kRepAck);
}

TEST_F(NegotiationTest, StartTlsWithDataOrTwiceIsInvalid) {
  Negotiator n(&exports_, ClientFlags{true, false}, &shutting_down_, TlsPolicy{true, true, false});
  auto with_data = n.Handle(Opt(kOptStartTls, {1}));
  EXPECT_EQ(with_data.next, Negotiator::Next::kContinue);
  EXPECT_EQ(Replies(with_data.reply)[0].type, kRepErrInvalid);
  // Inside TLS: a second STARTTLS is invalid, and everything else works.
  Negotiator in_tls(&exports_, ClientFlags{true, false}, &shutting_down_,
                    TlsPolicy{true, true, true});
  auto again = in_tls.Handle(Opt(kOptStartTls));
  EXPECT_EQ(again.next, Negotiator::Next::kContinue);
  EXPECT_EQ(Replies(again.reply)[0].type, kRepErrInvalid);
  EXPECT_EQ(in_tls.Handle(Opt(kOptGo, GoData("disk"))).next, Negotiator::Next::kTransmission);
}

TEST_F(NegotiationTest, TlsOfferedLeavesPlaintextWorking) {
  Negotiator n(&exports_, ClientFlags{true, false}, &shutting_down_, TlsPolicy{true, false, false});
  EXPECT_EQ(Replies(n.Handle(Opt(kOptStructuredReply)).reply)[0].type, kRepAck);
  EXPECT_EQ(n.Handle(Opt(kOptStartTls)).next, Negotiator::Next::kStartTls);
  Negotiator plain(&exports_, ClientFlags{true, false}, &shutting_down_,
                   TlsPolicy{true, false, false});
  EXPECT_EQ(plain.Handle(Opt(kOptGo, GoData("disk"))).next, Negotiator::Next::kTransmission);
}

TEST_F(NegotiationTest, MalformedOptionIsInvalid) {
  Negotiator n = Make();
  Bytes bad = GoData("disk");
  bad.push_back(0);
  auto r = Replies(n.Handle(Opt(kOptGo, bad)).reply);
  EXPECT_EQ(r[0].type, kRepErrInvalid);
  EXPECT_FALSE(r[0].data.empty());  // a message for humans
}

TEST_F(NegotiationTest, AbortAcksAndCloses) {
  Negotiator n = Make();
  auto step = n.Handle(Opt(kOptAbort));
  EXPECT_EQ(step.next, Negotiator::Next::kClose);
  EXPECT_EQ(Replies(step.reply)[0].type, kRepAck);
}

TEST_F(NegotiationTest, ShutdownRefusesOptionsButAbort) {
  Negotiator n = Make();
  shutting_down_ = true;
  EXPECT_EQ(Replies(n.Handle(Opt(kOptGo, GoData("disk"))).reply)[0].type,
            kRepErrShutdown);
  EXPECT_EQ(Replies(n.Handle(Opt(kOptList)).reply)[0].type, kRepErrShutdown);
  EXPECT_EQ(n.Handle(Opt(kOptExportName, {})).next, Negotiator::Next::kClose);
  EXPECT_EQ(n.Handle(Opt(kOptAbort)).next, Negotiator::Next::kClose);
}

// An endless stream of options (LIST, INFO, unknown) must not keep a
// connection in negotiation forever: past the limit the server refuses with
// ERR_POLICY and ends the session, while a session within it still goes on.
TEST_F(NegotiationTest, EndlessOptionStreamIsCutOffAtTheLimit) {
  Negotiator n = Make();
  const size_t limit = n.MaxOptions();
  EXPECT_EQ(limit, kMaxOptionsPerSession + exports_.size());
  const uint32_t kinds[] = {kOptList, kOptInfo, 1000};
  for (size_t i = 0; i < limit; ++i) {
    const uint32_t code = kinds[i % 3];
    auto step = n.Handle(Opt(code, code == kOptInfo ? GoData("disk") : Bytes{}));
    ASSERT_EQ(step.next, Negotiator::Next::kContinue) << "option " << i;
    EXPECT_NE(Replies(step.reply).back().type, kRepErrPolicy) << "option " << i;
  }
  auto over = n.Handle(Opt(kOptGo, GoData("disk")));
  EXPECT_EQ(over.next, Negotiator::Next::kClose);
  auto r = Replies(over.reply);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].type, kRepErrPolicy);
  EXPECT_EQ(r[0].option, kOptGo);
}

TEST_F(NegotiationTest, ExportNamePastTheOptionLimitClosesWithoutReply) {
  Negotiator n = Make();
  for (size_t i = 0; i < n.MaxOptions(); ++i) (void)n.Handle(Opt(kOptList));
  auto step = n.Handle(Opt(kOptExportName, {}));
  EXPECT_EQ(step.next, Negotiator::Next::kClose);
  EXPECT_TRUE(step.reply.empty());
}

}  // namespace
}  // namespace thindisk::nbd
