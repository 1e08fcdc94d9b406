// Transmission codec: requests and replies <-> bytes. No sockets.
//
// Requests are decoded incrementally (decoded.h) and validated here, once, at
// the edge (ValidateRequest): everything below the codec may assume a request
// is in bounds, its flags are allowed and the export permits it. Replies are
// encoded as headers; bulk data (READ payloads) is appended by the caller so
// it is never copied into a second buffer.
//
// Status -> NBD error mapping lives in exactly one function here
// (NbdErrorFromStatus).
//
// Thread safety: stateless free functions; safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nbd/decoded.h"
#include "nbd/protocol.h"
#include "util/result.h"
#include "util/status.h"

namespace thindisk::nbd {

struct Request {
  uint16_t flags = 0;  // NBD_CMD_FLAG_*
  uint16_t type = 0;   // NBD_CMD_*
  uint64_t handle = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
};

// Decodes a 28-byte request header. Errors (kCorrupt) on a bad magic: the
// stream is out of sync and the session must end. For NBD_CMD_WRITE the
// caller then reads (or, when the request is invalid, skips)
// WirePayloadLength(request) bytes.
Result<Decoded<Request>> DecodeRequest(std::span<const uint8_t> in);

// Bytes that follow the header on the wire: `length` for WRITE, else 0.
uint32_t WirePayloadLength(const Request& request);

// What the negotiation settled, which decides whether a request is valid.
struct RequestContext {
  uint64_t export_size = 0;
  bool read_only = false;
  uint16_t transmission_flags = 0;  // as advertised to this client
  bool structured_replies = false;
  bool has_meta_contexts = false;  // at least one context selected
};

// The verdict on one request: error 0 means execute it; otherwise reply
// with `error` (an NBD error value) and `message`.
struct Verdict {
  uint32_t error = 0;
  std::string message;
  bool ok() const { return error == 0; }
};

// Validates a request once, at the edge:
//  - unknown command, or a flag not allowed for the command or not
//    negotiated (FUA without SEND_FUA, DF without SEND_DF, ...): EINVAL;
//  - WRITE, TRIM, WRITE_ZEROES on a read-only export: EPERM;
//  - a command whose transmission flag was not advertised, BLOCK_STATUS
//    without a selected metadata context: EINVAL;
//  - FLUSH with non-zero offset or length, any other command with length 0:
//    EINVAL;
//  - READ or WRITE longer than kMaxPayloadLength: EINVAL;
//  - offset + length overflowing or past the export size: ENOSPC for
//    WRITE, TRIM and WRITE_ZEROES (as the spec recommends), else EINVAL.
// NBD_CMD_DISC is always valid (it has no reply).
Verdict ValidateRequest(const Request& request, const RequestContext& context);

// The one place a Status becomes an NBD error value: kNoSpace -> ENOSPC,
// kReadOnly -> EPERM, kInvalidArgument and kOutOfRange -> EINVAL,
// kNotSupported -> ENOTSUP, anything else -> EIO. OK -> 0.
uint32_t NbdErrorFromStatus(const Status& status);

// Transmission flags for an export: everything thindisk supports, minus the
// write-side features on a read-only export; SEND_DF only with structured
// replies (the spec forbids it otherwise).
uint16_t TransmissionFlags(bool read_only, bool structured_replies);

// ---- Replies ----
using SimpleReplyHeader = std::array<uint8_t, kSimpleReplyHeaderSize>;
using ChunkHeader = std::array<uint8_t, kChunkHeaderSize>;

// Simple reply header; a successful READ's data follows it.
SimpleReplyHeader EncodeSimpleReply(uint64_t handle, uint32_t error);
// Structured reply chunk header for a payload of `payload_length` bytes.
ChunkHeader EncodeChunkHeader(uint16_t flags, uint16_t type, uint64_t handle,
                              uint32_t payload_length);
// NBD_REPLY_TYPE_OFFSET_DATA header plus its offset field; `data_length`
// bytes of data follow it. REQUIRES: 0 < data_length <= UINT32_MAX - 8.
std::array<uint8_t, kChunkHeaderSize + 8> EncodeOffsetDataHeader(uint16_t flags,
                                                                 uint64_t handle,
                                                                 uint64_t offset,
                                                                 uint32_t data_length);
// NBD_REPLY_TYPE_OFFSET_HOLE. REQUIRES: hole_size > 0.
std::array<uint8_t, kChunkHeaderSize + 12> EncodeOffsetHole(uint16_t flags,
                                                            uint64_t handle,
                                                            uint64_t offset,
                                                            uint32_t hole_size);

struct BlockDescriptor {
  uint32_t length = 0;  // > 0
  uint32_t status = 0;  // context-defined flags
};
// NBD_REPLY_TYPE_BLOCK_STATUS for one metadata context.
// REQUIRES: !descriptors.empty().
std::vector<uint8_t> EncodeBlockStatus(uint16_t flags, uint64_t handle,
                                       uint32_t context_id,
                                       std::span<const BlockDescriptor> descriptors);
// NBD_REPLY_TYPE_ERROR with a message (truncated to fit its 16-bit length
// and kMaxStringLength).
std::vector<uint8_t> EncodeErrorChunk(uint16_t flags, uint64_t handle, uint32_t error,
                                      std::string_view message);
// NBD_REPLY_TYPE_NONE with NBD_REPLY_FLAG_DONE: "the reply is complete".
ChunkHeader EncodeNoneChunk(uint64_t handle);

// "NBD_CMD_READ", ... or "unknown", for messages.
std::string_view CommandName(uint16_t type);

}  // namespace thindisk::nbd
