// thindisk io: a few qemu-io commands against an image.
#include "cli/io_cmd.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <sstream>
#include <vector>

#include "block/open.h"
#include "cli/common.h"

namespace thindisk::cli {
namespace {

// A single request is capped so a typo ("write 0 1T") fails cleanly instead
// of trying to allocate a terabyte buffer; qemu-io has a similar limit.
constexpr uint64_t kMaxRequestBytes = 1ull << 30;

std::vector<std::string> Tokenize(std::string_view line) {
  std::vector<std::string> tokens;
  std::istringstream in{std::string(line)};
  std::string t;
  while (in >> t) tokens.push_back(t);
  return tokens;
}

Result<uint8_t> ParsePattern(const std::string& text) {
  auto bad = Status::InvalidArgument("invalid pattern '" + text + "': expected a byte (0-255)");
  if (text.empty()) return bad;
  size_t used = 0;
  unsigned long value = 0;
  try {
    value = std::stoul(text, &used, 0);
  } catch (...) {
    return bad;
  }
  if (used != text.size() || value > 255) return bad;
  return static_cast<uint8_t>(value);
}

// "4 KiB" / "866.197 KiB": qemu-io's cvtstr, trailing zeros trimmed.
std::string ShortSize(double value) {
  static const char* const kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f", value);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s + " " + kUnits[unit];
}

void PrintReport(const char* verb, const IoRequest& r, double seconds) {
  if (r.quiet) return;
  std::printf("%s %" PRIu64 "/%" PRIu64 " bytes at offset %" PRIu64 "\n", verb, r.length,
              r.length, r.offset);
  double t = seconds > 0 ? seconds : 1e-9;
  std::printf("%s, 1 ops; %05.2f sec (%s/sec and %.4f ops/sec)\n",
              ShortSize(static_cast<double>(r.length)).c_str(), seconds,
              ShortSize(static_cast<double>(r.length) / t).c_str(), 1.0 / t);
}

}  // namespace

std::string FormatHexDump(uint64_t offset, std::span<const uint8_t> bytes) {
  std::string out;
  char cell[32];
  for (size_t line = 0; line < bytes.size(); line += 16) {
    size_t n = std::min<size_t>(16, bytes.size() - line);
    std::snprintf(cell, sizeof(cell), "%08" PRIx64 ":  ", offset + line);
    out += cell;
    for (size_t k = 0; k < n; ++k) {
      std::snprintf(cell, sizeof(cell), "%02x ", bytes[line + k]);
      out += cell;
    }
    out += ' ';
    // Plain ASCII letters and digits only (qemu-io uses isalnum in the C
    // locale), so the dump never depends on the user's locale.
    for (size_t k = 0; k < n; ++k) {
      uint8_t b = bytes[line + k];
      bool alnum = (b >= '0' && b <= '9') || (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z');
      out += alnum ? char(b) : '.';
    }
    out += '\n';
  }
  return out;
}

Result<IoRequest> ParseIoCommand(std::string_view line) {
  std::vector<std::string> tokens = Tokenize(line);
  if (tokens.empty()) return Status::InvalidArgument("empty io command");
  IoRequest r;
  const std::string& name = tokens[0];
  if (name == "read") {
    r.kind = IoRequest::Kind::kRead;
  } else if (name == "write") {
    r.kind = IoRequest::Kind::kWrite;
  } else if (name == "discard") {
    r.kind = IoRequest::Kind::kDiscard;
  } else if (name == "flush" || name == "aio_flush") {
    r.kind = IoRequest::Kind::kFlush;
  } else {
    return Status::InvalidArgument("unknown io command '" + name + "'");
  }
  std::vector<std::string> args;
  for (size_t i = 1; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (t.size() < 2 || t[0] != '-' || !args.empty()) {
      args.push_back(t);
      continue;
    }
    for (size_t k = 1; k < t.size(); ++k) {
      char flag = t[k];
      bool is_read = r.kind == IoRequest::Kind::kRead;
      bool is_write = r.kind == IoRequest::Kind::kWrite;
      if (flag == 'P' && (is_read || is_write)) {
        // The value is the rest of this token or the next token.
        std::string value = t.substr(k + 1);
        if (value.empty()) {
          if (i + 1 >= tokens.size()) return Status::InvalidArgument(name + ": -P needs a pattern");
          value = tokens[++i];
        }
        TD_ASSIGN_OR_RETURN(r.pattern, ParsePattern(value));
        r.has_pattern = true;
        break;
      } else if (flag == 'z' && is_write) {
        r.zero = true;
      } else if (flag == 'u' && is_write) {
        r.unmap = true;
      } else if (flag == 'f' && is_write) {
        r.fua = true;
      } else if (flag == 'q' && r.kind != IoRequest::Kind::kFlush) {
        r.quiet = true;
      } else if (flag == 'v' && is_read) {
        r.verbose = true;
      } else {
        return Status::InvalidArgument(name + ": invalid option -- '" + std::string(1, flag) + "'");
      }
    }
  }
  if (r.kind == IoRequest::Kind::kFlush) {
    if (!args.empty()) return Status::InvalidArgument(name + " takes no arguments");
    return r;
  }
  if (args.size() != 2) return Status::InvalidArgument(name + ": expected OFFSET LENGTH");
  auto offset = ParseSize(args[0]);
  if (!offset.has_value()) return offset.error().WithContext(name + ": offset");
  auto length = ParseSize(args[1]);
  if (!length.has_value()) return length.error().WithContext(name + ": length");
  r.offset = *offset;
  r.length = *length;
  if (r.zero && r.has_pattern) return Status::InvalidArgument("write: -z and -P are exclusive");
  if (r.unmap && !r.zero) return Status::InvalidArgument("write: -u requires -z");
  if (!r.zero && r.kind != IoRequest::Kind::kDiscard && r.length > kMaxRequestBytes) {
    return Status::InvalidArgument(name + ": length " + args[1] + " exceeds 1 GiB per request");
  }
  return r;
}

bool ExecuteIoRequest(block::Device& dev, const IoRequest& r) {
  auto start = std::chrono::steady_clock::now();
  auto seconds = [&]() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto failed = [&](const char* what, const Status& s) {
    PrintError(std::string(what) + " failed: " + s.message());
    return false;
  };
  switch (r.kind) {
    case IoRequest::Kind::kFlush: {
      Status s = dev.Flush();
      return s.ok() ? true : failed("flush", s);
    }
    case IoRequest::Kind::kDiscard: {
      Status s = dev.Discard(r.offset, r.length);
      if (!s.ok()) return failed("discard", s);
      PrintReport("discard", r, seconds());
      return true;
    }
    case IoRequest::Kind::kWrite: {
      Status s;
      if (r.zero) {
        block::ZeroFlags flags;
        flags.may_unmap = r.unmap;
        flags.fua = r.fua;
        s = dev.WriteZeroes(r.offset, r.length, flags);
      } else {
        std::vector<uint8_t> buf(r.length, r.pattern);
        block::WriteFlags flags;
        flags.fua = r.fua;
        s = dev.Write(r.offset, buf, flags);
      }
      if (!s.ok()) return failed("write", s);
      PrintReport("wrote", r, seconds());
      return true;
    }
    case IoRequest::Kind::kRead: {
      std::vector<uint8_t> buf(r.length);
      Status s = dev.Read(r.offset, buf);
      if (!s.ok()) return failed("read", s);
      bool ok = true;
      if (r.has_pattern) {
        for (uint8_t b : buf) {
          if (b != r.pattern) {
            // qemu-io names the request, not the first bad byte.
            std::printf("Pattern verification failed at offset %" PRIu64 ", %" PRIu64 " bytes\n",
                        r.offset, r.length);
            ok = false;
            break;
          }
        }
      }
      // qemu-io: the dump comes after the pattern check and, like the
      // report, not at all with -q.
      if (r.verbose && !r.quiet) std::fputs(FormatHexDump(r.offset, buf).c_str(), stdout);
      PrintReport("read", r, seconds());
      return ok;
    }
  }
  return false;
}

namespace {

class IoCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand("io", "Run qemu-io style commands on an image");
    sub->footer(
        "Commands (-c, repeatable, run in order):\n"
        "  write [-P PATTERN] [-z [-u]] [-f] [-q] OFFSET LENGTH   (default pattern 0xcd)\n"
        "  read [-P PATTERN] [-v] [-q] OFFSET LENGTH   (-P: verify every byte; -v: hex dump)\n"
        "  discard [-q] OFFSET LENGTH\n"
        "  flush | aio_flush\n"
        "Exit status 1 when any command fails or a pattern does not match.");
    sub->add_option("-f,--format", format_, "Image format (default: probe)");
    sub->add_option("-c,--cmd", commands_, "Command to run")->required()->allow_extra_args(false);
    sub->add_flag("-r,--read-only", read_only_, "Open the image read-only");
    sub->add_flag("-U,--force-share", force_share_,
                  "With -r: read even while another process writes the image (ignores its lock)");
    sub->add_option("filename", filename_, "Image file")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    // Parse everything first so a typo in the last command writes nothing.
    std::vector<IoRequest> requests;
    for (const std::string& c : commands_) {
      TD_ASSIGN_OR_RETURN(IoRequest r, ParseIoCommand(c));
      requests.push_back(r);
    }
    block::OpenOptions options;
    options.format = format_;
    options.read_only = read_only_;
    options.force_share = force_share_;
    TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> dev, block::Open(filename_, options));
    bool all_ok = true;
    for (const IoRequest& r : requests) {
      if (!ExecuteIoRequest(*dev, r)) all_ok = false;
    }
    std::fflush(stdout);
    TD_RETURN_IF_ERROR(dev->Close());
    return all_ok ? Outcome::kSuccess : Outcome::kCommandFailed;
  }

 private:
  std::string format_;
  std::vector<std::string> commands_;
  bool read_only_ = false;
  bool force_share_ = false;
  std::string filename_;
};

}  // namespace

std::unique_ptr<Subcommand> NewIoCommand() { return std::make_unique<IoCommand>(); }

}  // namespace thindisk::cli
