// Handshake codec: fixed-newstyle negotiation bytes <-> messages. No sockets.
//
// Server side only: it encodes what the server sends (greeting, option
// replies, NBD_REP_INFO, the NBD_OPT_EXPORT_NAME reply) and decodes what a
// client sends (client flags, options). Oldstyle negotiation is never
// offered. Decoders are incremental (decoded.h) and bounded: an option's
// length is checked against kMaxOptionLength on its 16-byte header, before
// its payload is waited for or allocated.
//
// Thread safety: stateless free functions; safe from any thread.
#pragma once

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

using Bytes = std::vector<uint8_t>;

// "NBDMAGIC" "IHAVEOPT" + handshake flags (FIXED_NEWSTYLE | NO_ZEROES).
Bytes EncodeGreeting();

struct ClientFlags {
  bool fixed_newstyle = false;
  bool no_zeroes = false;
};
// Decodes the 32-bit client flags. Errors (kInvalidArgument) on a flag the
// server did not advertise: the spec says the server MUST then disconnect.
Result<Decoded<ClientFlags>> DecodeClientFlags(std::span<const uint8_t> in);

// One client option with its payload parsed according to its code.
struct Option {
  uint32_t code = 0;
  uint32_t length = 0;  // payload length as sent
  // OK when the payload is well formed for `code`. Otherwise the option was
  // framed correctly but its payload is malformed: the server answers
  // NBD_REP_ERR_INVALID with this message and negotiation continues.
  Status payload_status;
  // EXPORT_NAME, INFO, GO, LIST_META_CONTEXT, SET_META_CONTEXT.
  std::string export_name;
  // INFO, GO: the NBD_INFO_* types the client asked for.
  std::vector<uint16_t> info_requests;
  // LIST_META_CONTEXT, SET_META_CONTEXT.
  std::vector<std::string> queries;
};

// Decodes one option (16-byte header + payload). Errors, which end the
// session: bad magic (kCorrupt); length > kMaxOptionLength (kOutOfRange,
// decided on the header alone). Unknown option codes decode fine (the
// server answers NBD_REP_ERR_UNSUP).
Result<Decoded<Option>> DecodeOption(std::span<const uint8_t> in);

// ---- Option replies ----
// Generic: IHAVEOPT-reply magic, option, type, length, data.
Bytes EncodeOptionReply(uint32_t option, uint32_t type,
                        std::span<const uint8_t> data = {});
// An error reply (type has bit 31 set) with a human-readable message,
// truncated to kMaxStringLength.
Bytes EncodeOptionError(uint32_t option, uint32_t type, std::string_view message);
// NBD_REP_SERVER for NBD_OPT_LIST: name, then description for humans.
Bytes EncodeRepServer(uint32_t option, std::string_view name,
                      std::string_view description);
// NBD_REP_META_CONTEXT: context id and name.
Bytes EncodeRepMetaContext(uint32_t option, uint32_t context_id, std::string_view name);
// NBD_REP_INFO payloads.
Bytes EncodeInfoExport(uint32_t option, uint64_t size, uint16_t transmission_flags);
Bytes EncodeInfoName(uint32_t option, std::string_view name);
Bytes EncodeInfoDescription(uint32_t option, std::string_view description);
Bytes EncodeInfoBlockSize(uint32_t option, uint32_t minimum, uint32_t preferred,
                          uint32_t maximum);
// The reply to NBD_OPT_EXPORT_NAME: size, flags, and 124 zero bytes unless
// the client set NBD_FLAG_C_NO_ZEROES.
Bytes EncodeExportNameReply(uint64_t size, uint16_t transmission_flags, bool no_zeroes);

// Human name of an option code for messages ("NBD_OPT_GO"), or "unknown".
std::string_view OptionName(uint32_t code);

}  // namespace thindisk::nbd
