// qemu-io's command language for `thindisk io -c CMD`: parsing (pure, unit
// tested) and execution against a block::Device.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "block/device.h"
#include "util/result.h"

namespace thindisk::cli {

// qemu-io writes 0xcd when no -P is given.
inline constexpr uint8_t kDefaultWritePattern = 0xcd;

struct IoRequest {
  enum class Kind { kRead, kWrite, kDiscard, kFlush };
  Kind kind = Kind::kFlush;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool has_pattern = false;  // read: verify; write: fill byte given
  uint8_t pattern = kDefaultWritePattern;
  bool zero = false;   // write -z: write zeroes, not a buffer
  bool unmap = false;  // write -z -u: may free space
  bool fua = false;    // write -f
  bool quiet = false;  // -q: no report lines (and no dump)
  bool verbose = false;  // read -v: dump the bytes read (FormatHexDump)
};

// Parses one command: "write [-P PATTERN] [-z [-u]] [-f] [-q] OFF LEN",
// "read [-P PATTERN] [-q] [-v] OFF LEN", "discard [-q] OFF LEN", "flush",
// "aio_flush". Numbers take k/M/G/T suffixes (ParseSize); patterns are
// decimal or 0x-hex bytes. Errors name the command and what is wrong.
Result<IoRequest> ParseIoCommand(std::string_view line);

// qemu-io's `read -v` dump of `bytes` read at guest `offset`: one line per
// 16 bytes, "%08x:  " (the line's offset), "%02x " per byte, a space, then
// each byte as itself when isalnum() in the C locale, else '.'.
std::string FormatHexDump(uint64_t offset, std::span<const uint8_t> bytes);

// Runs `request` on `dev`, printing qemu-io's report lines on stdout
// ("wrote 4096/4096 bytes at offset 0", then a throughput line); read -v
// prints the dump first, as qemu-io does.
// Returns false when the request failed or a read pattern did not match
// ("Pattern verification failed at offset N, M bytes"); errors go to stderr.
bool ExecuteIoRequest(block::Device& dev, const IoRequest& request);

}  // namespace thindisk::cli
