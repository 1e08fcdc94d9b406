// The values of qemu-nbd's options as `thindisk serve` reads them, so a
// qemu-nbd command line runs unchanged with `thindisk serve` in its place
// (docs/qemu-nbd.md lists every option and what thindisk does with it).
//
// Each parser takes the text after the option, returns the value or
// kInvalidArgument naming the option and the accepted spellings, and does
// nothing else: serve_cmd.cc applies the values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "io/storage.h"
#include "nbd/filter_device.h"
#include "qcow2/snapshot_selector.h"
#include "util/result.h"

namespace thindisk::cli {

// --cache=none|writeback|writethrough|directsync|unsafe (qemu's cache modes;
// `option` names the flag in the error: convert's -t and -T take them too).
// write_through: every write is durable before its reply (writethrough =
// writeback + that; directsync = none (O_DIRECT) + that).
struct CacheChoice {
  io::CacheMode mode = io::CacheMode::kWriteback;
  bool write_through = false;
};
Result<CacheChoice> ParseCacheMode(std::string_view text, std::string_view option = "--cache");
// The modes the image tools' -t and -T take, for their help.
inline constexpr char kCacheModesHelp[] =
    "writeback (default), none or directsync (O_DIRECT), writethrough, unsafe";

// --aio=threads|native|io_uring, parsed for qemu-nbd command lines. Every
// mode runs on threads, our fastest path: the worker pool over buffered or
// O_DIRECT pread/pwrite beat an io_uring ring per worker (docs/performance.md).
enum class AioChoice { kThreads, kIoUring };
Result<AioChoice> ParseAioMode(std::string_view text);

// --discard=ignore|off|unmap|on (off = ignore, on = unmap, as in qemu).
Result<nbd::FilterOptions::Discard> ParseDiscardMode(std::string_view text);

// --detect-zeroes=off|on|unmap.
Result<nbd::FilterOptions::DetectZeroes> ParseDetectZeroesMode(std::string_view text);

// qemu's rule: detect-zeroes=unmap only together with discard=unmap.
Status CheckFilterOptions(const nbd::FilterOptions& filter);

// -o/--offset: a byte count as qemu-nbd reads it (strtoll base 0: decimal,
// 0x hex, leading-0 octal; no suffix, not negative).
Result<uint64_t> ParseOffset(std::string_view text);

// -l/--load-snapshot: "snapshot.id=ID,snapshot.name=NAME" (either or both)
// or a bare ID_OR_NAME. `flag` names the option in messages (convert has
// only -l).
Result<qcow2::SnapshotSelector> ParseLoadSnapshot(
    std::string_view text, std::string_view flag = "-l/--load-snapshot");

// --image-opts: FILE is a set of block options instead of a file name.
// Understood (qemu's spellings): driver=qcow2|raw|vmdk|vpc|file (none:
// the format is probed, as qemu does), file.driver=file,
// file.filename=PATH (filename=PATH with driver=file),
// read-only, cache.direct, cache.no-flush, discard, detect-zeroes,
// file.aio, and for driver=raw offset= and size=. Anything else is
// kInvalidArgument naming the key, so nothing is silently ignored.
struct ImageOpts {
  std::string filename;
  std::string format;  // "" when no driver= is given: probe
  std::optional<bool> read_only;
  std::optional<bool> cache_direct;    // O_DIRECT
  std::optional<bool> cache_no_flush;  // flushes do nothing (cache=unsafe)
  std::optional<nbd::FilterOptions::Discard> discard;
  std::optional<nbd::FilterOptions::DetectZeroes> detect_zeroes;
  std::optional<AioChoice> aio;
  uint64_t offset = 0;            // raw only
  std::optional<uint64_t> size;   // raw only
  bool bare_filename = false;     // named by filename= (driver=file's key)
};
Result<ImageOpts> ParseImageOpts(std::string_view text);

}  // namespace thindisk::cli
