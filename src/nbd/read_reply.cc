#include "nbd/read_reply.h"

#include <algorithm>
#include <cstring>

#include "io/storage.h"

namespace thindisk::nbd {

std::vector<Segment> PlanSegments(uint64_t offset, const block::ReadPlan& plan) {
  std::vector<Segment> out;
  for (const block::ReadPiece& p : plan.pieces) {
    const bool hole = p.storage == nullptr;
    if (!out.empty() && out.back().hole == hole) {
      out.back().length += uint32_t(p.length);
    } else {
      out.push_back({offset + p.buf_offset, uint32_t(p.length), hole});
    }
  }
  return out;
}

bool AnyData(const std::vector<Segment>& segments) {
  return std::any_of(segments.begin(), segments.end(),
                     [](const Segment& seg) { return !seg.hole; });
}

bool RingCanRead(const block::ReadPlan& plan) {
  return std::all_of(plan.pieces.begin(), plan.pieces.end(),
                     [](const block::ReadPiece& p) {
                       return p.storage == nullptr || p.storage->ReadFd() >= 0;
                     });
}

std::vector<AsyncReads::HostRead> HostReads(const block::ReadPlan& plan,
                                            std::span<uint8_t> data, bool chunked) {
  std::vector<AsyncReads::HostRead> reads;
  for (const block::ReadPiece& p : plan.pieces) {
    std::span<uint8_t> dst = data.subspan(p.buf_offset, p.length);
    if (p.storage != nullptr) {
      reads.push_back({p.storage, p.host_offset, dst});
    } else if (!chunked) {
      std::memset(dst.data(), 0, dst.size());
    }
  }
  return reads;
}

OutgoingReply ChunkedReply(const Request& r, const std::vector<Segment>& segments,
                           PayloadBuffer data) {
  OutgoingReply reply;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& seg = segments[i];
    const uint16_t flags = i + 1 == segments.size() ? kReplyFlagDone : 0;
    if (seg.hole) {
      reply.AddHead(EncodeOffsetHole(flags, r.handle, seg.offset, seg.length));
    } else {
      reply.AddHead(EncodeOffsetDataHeader(flags, r.handle, seg.offset, seg.length));
      reply.AddData(seg.offset - r.offset, seg.length);
    }
  }
  reply.SetData(std::move(data));
  return reply;
}

}  // namespace thindisk::nbd
