// NBD wire constants, named as in the NBD protocol specification
// (NetworkBlockDevice/nbd doc/proto.md): NBD_OPT_GO -> kOptGo and so on.
//
// Every value here is on the wire in network byte order; encode and decode
// them only through util/endian.h (handshake_codec.h, transmission_codec.h).
//
// Numbering note: older snapshots of proto.md list LIST_META_CONTEXT as 10
// and SET_META_CONTEXT as 11 (with a withdrawn NBD_OPT_BLOCK_SIZE at 9). The
// merged specification, and every client (libnbd, qemu, the kernel), use 9
// and 10; those are the values below.
#pragma once

#include <cstdint>

namespace thindisk::nbd {

// ---- Magics ----
inline constexpr uint64_t kInitPasswd = 0x4e42444d41474943ULL;  // "NBDMAGIC"
inline constexpr uint64_t kOldstyleMagic =
    0x00420281861253ULL;                                      // cliserv_magic (refused)
inline constexpr uint64_t kIHaveOpt = 0x49484156454F5054ULL;  // "IHAVEOPT"
inline constexpr uint64_t kOptReplyMagic = 0x3e889045565a9ULL;
inline constexpr uint32_t kRequestMagic = 0x25609513;
inline constexpr uint32_t kSimpleReplyMagic = 0x67446698;
inline constexpr uint32_t kStructuredReplyMagic = 0x668e33ef;

// ---- Handshake flags (server, 16 bits) ----
inline constexpr uint16_t kFlagFixedNewstyle = 1 << 0;
inline constexpr uint16_t kFlagNoZeroes = 1 << 1;

// ---- Client flags (32 bits) ----
inline constexpr uint32_t kFlagCFixedNewstyle = 1 << 0;
inline constexpr uint32_t kFlagCNoZeroes = 1 << 1;

// ---- Transmission flags (16 bits) ----
inline constexpr uint16_t kFlagHasFlags = 1 << 0;
inline constexpr uint16_t kFlagReadOnly = 1 << 1;
inline constexpr uint16_t kFlagSendFlush = 1 << 2;
inline constexpr uint16_t kFlagSendFua = 1 << 3;
inline constexpr uint16_t kFlagRotational = 1 << 4;
inline constexpr uint16_t kFlagSendTrim = 1 << 5;
inline constexpr uint16_t kFlagSendWriteZeroes = 1 << 6;
inline constexpr uint16_t kFlagSendDf = 1 << 7;
inline constexpr uint16_t kFlagCanMultiConn = 1 << 8;
inline constexpr uint16_t kFlagSendResize = 1 << 9;
inline constexpr uint16_t kFlagSendCache = 1 << 10;
inline constexpr uint16_t kFlagSendFastZero = 1 << 11;

// ---- Option types ----
inline constexpr uint32_t kOptExportName = 1;
inline constexpr uint32_t kOptAbort = 2;
inline constexpr uint32_t kOptList = 3;
inline constexpr uint32_t kOptPeekExport = 4;  // withdrawn
inline constexpr uint32_t kOptStartTls = 5;
inline constexpr uint32_t kOptInfo = 6;
inline constexpr uint32_t kOptGo = 7;
inline constexpr uint32_t kOptStructuredReply = 8;
inline constexpr uint32_t kOptListMetaContext = 9;
inline constexpr uint32_t kOptSetMetaContext = 10;
inline constexpr uint32_t kOptExtendedHeaders = 11;  // not supported: ERR_UNSUP

// ---- Option reply types ----
inline constexpr uint32_t kRepAck = 1;
inline constexpr uint32_t kRepServer = 2;
inline constexpr uint32_t kRepInfo = 3;
inline constexpr uint32_t kRepMetaContext = 4;
inline constexpr uint32_t kRepFlagError = 1U << 31;
inline constexpr uint32_t kRepErrUnsup = kRepFlagError | 1;
inline constexpr uint32_t kRepErrPolicy = kRepFlagError | 2;
inline constexpr uint32_t kRepErrInvalid = kRepFlagError | 3;
inline constexpr uint32_t kRepErrPlatform = kRepFlagError | 4;
inline constexpr uint32_t kRepErrTlsReqd = kRepFlagError | 5;
inline constexpr uint32_t kRepErrUnknown = kRepFlagError | 6;
inline constexpr uint32_t kRepErrShutdown = kRepFlagError | 7;
inline constexpr uint32_t kRepErrBlockSizeReqd = kRepFlagError | 8;
inline constexpr uint32_t kRepErrTooBig = kRepFlagError | 9;

// ---- NBD_REP_INFO types (NBD_OPT_INFO / NBD_OPT_GO) ----
inline constexpr uint16_t kInfoExport = 0;
inline constexpr uint16_t kInfoName = 1;
inline constexpr uint16_t kInfoDescription = 2;
inline constexpr uint16_t kInfoBlockSize = 3;

// ---- Command types ----
inline constexpr uint16_t kCmdRead = 0;
inline constexpr uint16_t kCmdWrite = 1;
inline constexpr uint16_t kCmdDisc = 2;
inline constexpr uint16_t kCmdFlush = 3;
inline constexpr uint16_t kCmdTrim = 4;
inline constexpr uint16_t kCmdCache = 5;
inline constexpr uint16_t kCmdWriteZeroes = 6;
inline constexpr uint16_t kCmdBlockStatus = 7;

// ---- Command flags ----
inline constexpr uint16_t kCmdFlagFua = 1 << 0;
inline constexpr uint16_t kCmdFlagNoHole = 1 << 1;
inline constexpr uint16_t kCmdFlagDf = 1 << 2;
inline constexpr uint16_t kCmdFlagReqOne = 1 << 3;
inline constexpr uint16_t kCmdFlagFastZero = 1 << 4;

// ---- Structured reply flags and types ----
inline constexpr uint16_t kReplyFlagDone = 1 << 0;
inline constexpr uint16_t kReplyTypeNone = 0;
inline constexpr uint16_t kReplyTypeOffsetData = 1;
inline constexpr uint16_t kReplyTypeOffsetHole = 2;
inline constexpr uint16_t kReplyTypeBlockStatus = 5;
inline constexpr uint16_t kReplyTypeError = (1 << 15) + 1;
inline constexpr uint16_t kReplyTypeErrorOffset = (1 << 15) + 2;

// ---- Error values (not host errno: the spec fixes these numbers) ----
inline constexpr uint32_t kEperm = 1;
inline constexpr uint32_t kEio = 5;
inline constexpr uint32_t kEnomem = 12;
inline constexpr uint32_t kEinval = 22;
inline constexpr uint32_t kEnospc = 28;
inline constexpr uint32_t kEoverflow = 75;
inline constexpr uint32_t kEnotsup = 95;
inline constexpr uint32_t kEshutdown = 108;

// ---- Metadata contexts and their block status flags ----
inline constexpr const char* kContextBaseAllocation = "base:allocation";
inline constexpr const char* kContextAllocationDepth = "qemu:allocation-depth";
inline constexpr uint32_t kStateHole = 1 << 0;  // base:allocation
inline constexpr uint32_t kStateZero = 1 << 1;  // base:allocation
// qemu's namespace (docs/interop/nbd.rst in QEMU): one context per exported
// dirty bitmap, with one flag.
inline constexpr const char* kContextDirtyBitmapPrefix = "qemu:dirty-bitmap:";
inline constexpr uint32_t kStateDirty = 1 << 0;

// ---- Wire sizes ----
inline constexpr size_t kGreetingSize = 18;  // NBDMAGIC, IHAVEOPT, 16-bit flags
inline constexpr size_t kClientFlagsSize = 4;
inline constexpr size_t kOptionHeaderSize = 16;  // IHAVEOPT, option, length
inline constexpr size_t kOptionReplyHeaderSize = 20;
inline constexpr size_t kExportNameReplyZeroes = 124;
inline constexpr size_t kRequestHeaderSize = 28;
inline constexpr size_t kSimpleReplyHeaderSize = 16;
inline constexpr size_t kChunkHeaderSize = 20;

// ---- Limits ----
// Strings (export names, queries, messages) MUST be no longer than 4096
// bytes (spec, "Conventions").
inline constexpr uint32_t kMaxStringLength = 4096;
// Largest option payload accepted, checked on the header before a byte of
// payload is read or allocated. The largest legitimate option is
// NBD_OPT_SET_META_CONTEXT: an export name plus a few queries, each at most
// kMaxStringLength with a 4-byte length; 64 KiB holds the name and 14
// maximal queries, far beyond what any client sends. A larger length can
// only be an attack on server memory, so it ends the session.
inline constexpr uint32_t kMaxOptionLength = 64 * 1024;
// Largest READ or WRITE payload (and the NBD_INFO_BLOCK_SIZE maximum we
// advertise). Bounds the memory one request can pin; 32 MiB is what qemu-nbd
// and nbdkit allow, so no client is surprised.
inline constexpr uint32_t kMaxPayloadLength = 32 * 1024 * 1024;

}  // namespace thindisk::nbd
