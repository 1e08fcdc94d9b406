#include "nbd/transmission_codec.h"

#include <algorithm>

#include "util/endian.h"

namespace thindisk::nbd {
namespace {

// Flags each command may carry, before negotiation narrows them further.
// FUA is "valid for all commands" once SEND_FUA is advertised (spec,
// "Command flags"); clients are known to set it on reads.
uint16_t AllowedFlags(uint16_t type) {
  switch (type) {
    case kCmdRead:
      return kCmdFlagFua | kCmdFlagDf;
    case kCmdWriteZeroes:
      return kCmdFlagFua | kCmdFlagNoHole | kCmdFlagFastZero;
    case kCmdBlockStatus:
      return kCmdFlagFua | kCmdFlagReqOne;
    default:
      return kCmdFlagFua;
  }
}

bool IsWriteCommand(uint16_t type) {
  return type == kCmdWrite || type == kCmdTrim || type == kCmdWriteZeroes;
}

// The transmission flag that must have been advertised for `type`, or 0.
uint16_t RequiredTransmissionFlag(uint16_t type) {
  switch (type) {
    case kCmdFlush:
      return kFlagSendFlush;
    case kCmdTrim:
      return kFlagSendTrim;
    case kCmdWriteZeroes:
      return kFlagSendWriteZeroes;
    case kCmdCache:
      return kFlagSendCache;
    default:
      return 0;
  }
}

Verdict Invalid(uint32_t error, std::string message) {
  return Verdict{error, std::move(message)};
}

}  // namespace

Result<Decoded<Request>> DecodeRequest(std::span<const uint8_t> in) {
  if (in.size() < kRequestHeaderSize)
    return Decoded<Request>::NeedMore(kRequestHeaderSize);
  if (LoadBe32(in.data()) != kRequestMagic)
    return Status::Corrupt("request does not start with NBD_REQUEST_MAGIC");
  Request r;
  r.flags = LoadBe16(in.data() + 4);
  r.type = LoadBe16(in.data() + 6);
  r.handle = LoadBe64(in.data() + 8);
  r.offset = LoadBe64(in.data() + 16);
  r.length = LoadBe32(in.data() + 24);
  return Decoded<Request>::Done(r, kRequestHeaderSize);
}

uint32_t WirePayloadLength(const Request& request) {
  return request.type == kCmdWrite ? request.length : 0;
}

Verdict ValidateRequest(const Request& r, const RequestContext& c) {
  const std::string name(CommandName(r.type));
  // 1. Known command; DISC needs nothing else (it has no reply).
  if (name == "unknown")
    return Invalid(kEinval, "unknown command " + std::to_string(r.type));
  if (r.type == kCmdDisc) return {};
  // 2. Flags allowed for this command and negotiated.
  if (r.flags & ~AllowedFlags(r.type))
    return Invalid(kEinval, name + ": flag not allowed");
  if ((r.flags & kCmdFlagFua) && !(c.transmission_flags & kFlagSendFua))
    return Invalid(kEinval, name + ": FUA not negotiated");
  if ((r.flags & kCmdFlagDf) && !(c.transmission_flags & kFlagSendDf))
    return Invalid(kEinval, name + ": DF not negotiated");
  if ((r.flags & kCmdFlagFastZero) && !(c.transmission_flags & kFlagSendFastZero))
    return Invalid(kEinval, name + ": FAST_ZERO not negotiated");
  // 3. Writes on a read-only export: EPERM, whether or not advertised.
  if (c.read_only && IsWriteCommand(r.type))
    return Invalid(kEperm, name + " on a read-only export");
  // 4. Commands that need negotiation.
  const uint16_t required = RequiredTransmissionFlag(r.type);
  if (required && !(c.transmission_flags & required))
    return Invalid(kEinval, name + " was not advertised");
  if (r.type == kCmdBlockStatus && !(c.structured_replies && c.has_meta_contexts))
    return Invalid(kEinval, "NBD_CMD_BLOCK_STATUS without a selected metadata context");
  // 5. Lengths.
  if (r.type == kCmdFlush) {
    if (r.offset != 0 || r.length != 0)
      return Invalid(kEinval, "NBD_CMD_FLUSH with non-zero offset or length");
    return {};
  }
  if (r.length == 0) return Invalid(kEinval, name + " with length 0");
  if ((r.type == kCmdRead || r.type == kCmdWrite) && r.length > kMaxPayloadLength)
    return Invalid(kEinval, name + " length " + std::to_string(r.length) + " exceeds " +
                                std::to_string(kMaxPayloadLength));
  // 6. Bounds, without overflow: offset + length <= size.
  if (r.offset > c.export_size || r.length > c.export_size - r.offset)
    return Invalid(IsWriteCommand(r.type) ? kEnospc : kEinval,
                   name + " beyond the end of the export");
  return {};
}

uint32_t NbdErrorFromStatus(const Status& status) {
  switch (status.code()) {
    case Code::kOk:
      return 0;
    case Code::kNoSpace:
      return kEnospc;
    case Code::kReadOnly:
      return kEperm;
    case Code::kInvalidArgument:
    case Code::kOutOfRange:
      return kEinval;
    case Code::kNotSupported:
      return kEnotsup;
    default:
      return kEio;
  }
}

uint16_t TransmissionFlags(bool read_only, bool structured_replies) {
  uint16_t flags =
      kFlagHasFlags | kFlagSendFlush | kFlagSendFua | kFlagCanMultiConn | kFlagSendCache;
  if (read_only) {
    flags |= kFlagReadOnly;
  } else {
    flags |= kFlagSendTrim | kFlagSendWriteZeroes | kFlagSendFastZero;
  }
  if (structured_replies) flags |= kFlagSendDf;
  return flags;
}

SimpleReplyHeader EncodeSimpleReply(uint64_t handle, uint32_t error) {
  SimpleReplyHeader h;
  StoreBe32(h.data(), kSimpleReplyMagic);
  StoreBe32(h.data() + 4, error);
  StoreBe64(h.data() + 8, handle);
  return h;
}

ChunkHeader EncodeChunkHeader(uint16_t flags, uint16_t type, uint64_t handle,
                              uint32_t payload_length) {
  ChunkHeader h;
  StoreBe32(h.data(), kStructuredReplyMagic);
  StoreBe16(h.data() + 4, flags);
  StoreBe16(h.data() + 6, type);
  StoreBe64(h.data() + 8, handle);
  StoreBe32(h.data() + 16, payload_length);
  return h;
}

std::array<uint8_t, kChunkHeaderSize + 8> EncodeOffsetDataHeader(uint16_t flags,
                                                                 uint64_t handle,
                                                                 uint64_t offset,
                                                                 uint32_t data_length) {
  std::array<uint8_t, kChunkHeaderSize + 8> out;
  ChunkHeader h = EncodeChunkHeader(flags, kReplyTypeOffsetData, handle, data_length + 8);
  std::copy(h.begin(), h.end(), out.begin());
  StoreBe64(out.data() + kChunkHeaderSize, offset);
  return out;
}

std::array<uint8_t, kChunkHeaderSize + 12> EncodeOffsetHole(uint16_t flags,
                                                            uint64_t handle,
                                                            uint64_t offset,
                                                            uint32_t hole_size) {
  std::array<uint8_t, kChunkHeaderSize + 12> out;
  ChunkHeader h = EncodeChunkHeader(flags, kReplyTypeOffsetHole, handle, 12);
  std::copy(h.begin(), h.end(), out.begin());
  StoreBe64(out.data() + kChunkHeaderSize, offset);
  StoreBe32(out.data() + kChunkHeaderSize + 8, hole_size);
  return out;
}

std::vector<uint8_t> EncodeBlockStatus(uint16_t flags, uint64_t handle,
                                       uint32_t context_id,
                                       std::span<const BlockDescriptor> descriptors) {
  const uint32_t payload = uint32_t(4 + 8 * descriptors.size());
  std::vector<uint8_t> out(kChunkHeaderSize + payload);
  ChunkHeader h = EncodeChunkHeader(flags, kReplyTypeBlockStatus, handle, payload);
  std::copy(h.begin(), h.end(), out.begin());
  uint8_t* p = out.data() + kChunkHeaderSize;
  StoreBe32(p, context_id);
  p += 4;
  for (const BlockDescriptor& d : descriptors) {
    StoreBe32(p, d.length);
    StoreBe32(p + 4, d.status);
    p += 8;
  }
  return out;
}

std::vector<uint8_t> EncodeErrorChunk(uint16_t flags, uint64_t handle, uint32_t error,
                                      std::string_view message) {
  message = message.substr(0, kMaxStringLength);
  const uint32_t payload = uint32_t(6 + message.size());
  std::vector<uint8_t> out(kChunkHeaderSize + payload);
  ChunkHeader h = EncodeChunkHeader(flags, kReplyTypeError, handle, payload);
  std::copy(h.begin(), h.end(), out.begin());
  StoreBe32(out.data() + kChunkHeaderSize, error);
  StoreBe16(out.data() + kChunkHeaderSize + 4, uint16_t(message.size()));
  std::copy(message.begin(), message.end(), out.begin() + kChunkHeaderSize + 6);
  return out;
}

ChunkHeader EncodeNoneChunk(uint64_t handle) {
  return EncodeChunkHeader(kReplyFlagDone, kReplyTypeNone, handle, 0);
}

std::string_view CommandName(uint16_t type) {
  switch (type) {
    case kCmdRead:
      return "NBD_CMD_READ";
    case kCmdWrite:
      return "NBD_CMD_WRITE";
    case kCmdDisc:
      return "NBD_CMD_DISC";
    case kCmdFlush:
      return "NBD_CMD_FLUSH";
    case kCmdTrim:
      return "NBD_CMD_TRIM";
    case kCmdCache:
      return "NBD_CMD_CACHE";
    case kCmdWriteZeroes:
      return "NBD_CMD_WRITE_ZEROES";
    case kCmdBlockStatus:
      return "NBD_CMD_BLOCK_STATUS";
    default:
      return "unknown";
  }
}

}  // namespace thindisk::nbd
