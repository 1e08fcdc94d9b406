#include "cli/serve_options.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "cli/common.h"

namespace thindisk::cli {
namespace {

using Discard = nbd::FilterOptions::Discard;
using DetectZeroes = nbd::FilterOptions::DetectZeroes;

Status BadValue(std::string_view option, std::string_view text, std::string_view accepted) {
  return Status::InvalidArgument("invalid " + std::string(option) + " '" + std::string(text) +
                                 "' (expected " + std::string(accepted) + ")");
}

// Applies one --image-opts key to `o`.
Status ApplyImageOpt(ImageOpts& o, const std::string& key, const std::string& value,
                     std::string* driver) {
  auto on_off = [&](std::optional<bool>* field) -> Status {
    TD_ASSIGN_OR_RETURN(bool v, ParseOnOff(key, value));
    *field = v;
    return Status::Ok();
  };
  if (key == "driver") {
    *driver = value;
  } else if (key == "file.filename") {
    o.filename = value;
  } else if (key == "filename") {
    o.filename = value;
    o.bare_filename = true;
  } else if (key == "file.driver") {
    if (value != "file")
      return Status::NotSupported("--image-opts: file.driver=" + value +
                                  " is not supported (only file.driver=file)");
  } else if (key == "read-only" || key == "file.read-only") {
    return on_off(&o.read_only);
  } else if (key == "cache.direct" || key == "file.cache.direct") {
    return on_off(&o.cache_direct);
  } else if (key == "cache.no-flush" || key == "file.cache.no-flush") {
    return on_off(&o.cache_no_flush);
  } else if (key == "discard") {
    TD_ASSIGN_OR_RETURN(o.discard, ParseDiscardMode(value));
  } else if (key == "detect-zeroes") {
    TD_ASSIGN_OR_RETURN(o.detect_zeroes, ParseDetectZeroesMode(value));
  } else if (key == "file.aio" || key == "aio") {
    TD_ASSIGN_OR_RETURN(o.aio, ParseAioMode(value));
  } else if (key == "offset") {
    TD_ASSIGN_OR_RETURN(o.offset, ParseSize(value));
  } else if (key == "size") {
    TD_ASSIGN_OR_RETURN(o.size, ParseSize(value));
  } else {
    return Status::InvalidArgument(
        "--image-opts: unsupported key '" + key +
        "' (thindisk knows driver, file.driver, file.filename, read-only, cache.direct, "
        "cache.no-flush, discard, detect-zeroes, file.aio, and offset/size for driver=raw)");
  }
  return Status::Ok();
}

}  // namespace

Result<CacheChoice> ParseCacheMode(std::string_view text, std::string_view option) {
  if (text == "writeback") return CacheChoice{io::CacheMode::kWriteback, false};
  if (text == "none") return CacheChoice{io::CacheMode::kNone, false};
  if (text == "writethrough") return CacheChoice{io::CacheMode::kWriteback, true};
  if (text == "directsync") return CacheChoice{io::CacheMode::kNone, true};
  if (text == "unsafe") return CacheChoice{io::CacheMode::kUnsafe, false};
  return BadValue(option, text, "none, writeback, writethrough, directsync or unsafe");
}

Result<AioChoice> ParseAioMode(std::string_view text) {
  if (text == "threads" || text == "native") return AioChoice::kThreads;
  if (text == "io_uring") return AioChoice::kIoUring;
  return BadValue("--aio", text, "threads, native or io_uring");
}

Result<Discard> ParseDiscardMode(std::string_view text) {
  if (text == "ignore" || text == "off") return Discard::kIgnore;
  if (text == "unmap" || text == "on") return Discard::kUnmap;
  return BadValue("--discard", text, "ignore, off, unmap or on");
}

Result<DetectZeroes> ParseDetectZeroesMode(std::string_view text) {
  if (text == "off") return DetectZeroes::kOff;
  if (text == "on") return DetectZeroes::kOn;
  if (text == "unmap") return DetectZeroes::kUnmap;
  return BadValue("--detect-zeroes", text, "off, on or unmap");
}

Status CheckFilterOptions(const nbd::FilterOptions& filter) {
  if (filter.detect_zeroes == DetectZeroes::kUnmap && filter.discard != Discard::kUnmap)
    return Status::InvalidArgument("--detect-zeroes=unmap needs --discard=unmap");
  return Status::Ok();
}

Result<uint64_t> ParseOffset(std::string_view text) {
  std::string s(text);
  // strtoll skips leading blanks and takes a sign; qemu refuses neither
  // sign nor blank in practice, but a negative offset is meaningless.
  if (s.empty() || !(s[0] >= '0' && s[0] <= '9'))
    return BadValue("-o/--offset", text, "a byte count: decimal, 0x hex or 0 octal");
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 0);
  if (errno != 0 || end != s.c_str() + s.size() || v < 0)
    return BadValue("-o/--offset", text, "a byte count: decimal, 0x hex or 0 octal");
  return uint64_t(v);
}

Result<qcow2::SnapshotSelector> ParseLoadSnapshot(std::string_view text,
                                                  std::string_view flag) {
  qcow2::SnapshotSelector sel;
  if (text.empty()) return BadValue(flag, text, "a snapshot id or name");
  // As qemu reads it: "snapshot." starts the key form, anything else is a
  // bare id or name.
  if (text.starts_with("snapshot.")) {
    TD_ASSIGN_OR_RETURN(OptionMap keys, ParseOptionString(text));
    for (const auto& [key, value] : keys) {
      if (key == "snapshot.id") {
        sel.id = value;
      } else if (key == "snapshot.name") {
        sel.name = value;
      } else {
        return Status::InvalidArgument(std::string(flag) + ": unknown key '" + key +
                                       "' (expected snapshot.id= and/or snapshot.name=)");
      }
    }
    if (sel.empty())
      return BadValue(flag, text, "a non-empty snapshot.id or snapshot.name");
    return sel;
  }
  sel.id_or_name = std::string(text);
  return sel;
}

Result<ImageOpts> ParseImageOpts(std::string_view text) {
  TD_ASSIGN_OR_RETURN(OptionMap keys, ParseOptionString(text));
  ImageOpts o;
  std::string driver;
  for (const auto& [key, value] : keys) TD_RETURN_IF_ERROR(ApplyImageOpt(o, key, value, &driver));
  if (driver == "file") {
    o.format = "raw";  // the protocol driver alone: the file's bytes
  } else if (driver == "qcow2" || driver == "raw" || driver == "vmdk" || driver == "vpc") {
    o.format = driver;
  } else if (driver.empty()) {
    // As qemu: file.filename= alone names the file and the format is
    // probed; a bare filename= needs a driver to belong to.
    if (o.filename.empty() || o.bare_filename)
      return Status::InvalidArgument(
          "--image-opts: give driver= (e.g. driver=qcow2) or file.filename= (probed)");
  } else {
    return Status::NotSupported("--image-opts: driver=" + driver + " is not supported");
  }
  if (o.filename.empty())
    return Status::InvalidArgument("--image-opts: file.filename= is missing");
  if (driver == "file" && !o.bare_filename)
    return Status::InvalidArgument(
        "--image-opts: driver=file takes filename=, not file.filename=");
  if (driver != "file" && o.bare_filename)
    return Status::InvalidArgument(
        "--image-opts: filename= is driver=file's; use file.filename=");
  if (driver != "raw" && (o.offset != 0 || o.size.has_value()))
    return Status::InvalidArgument("--image-opts: offset= and size= need driver=raw");
  return o;
}

}  // namespace thindisk::cli
