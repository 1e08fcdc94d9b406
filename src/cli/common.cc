#include "cli/common.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>

namespace thindisk::cli {

int ExitCodeFor(const Result<Outcome>& result, ErrorExit error_exit) {
  if (!result.has_value()) {
    PrintError(result.error());
    return error_exit == ErrorExit::kTwo ? 2 : 1;
  }
  switch (*result) {
    case Outcome::kSuccess:
      return 0;
    case Outcome::kImagesDiffer:
      return 1;
    case Outcome::kCheckFoundCorruption:
      return 2;
    case Outcome::kCheckFoundLeaks:
      return 3;
    case Outcome::kCommandFailed:
      return 1;
  }
  return 1;
}

void PrintError(const Status& status) { PrintError(status.message()); }

void PrintError(std::string_view message) {
  std::cout.flush();
  std::fflush(stdout);
  std::string line = fmt::format("thindisk: {}\n", message);
  std::fputs(line.c_str(), stderr);
}

const char* NodeKind(unsigned mode) {
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

void PrintWarning(std::string_view message) {
  std::cout.flush();
  std::fflush(stdout);
  std::string line = fmt::format("thindisk: warning: {}\n", message);
  std::fputs(line.c_str(), stderr);
}

Result<uint64_t> ParseSize(std::string_view text) {
  auto invalid = [&]() {
    return Status::InvalidArgument(fmt::format(
        "invalid size '{}': use a number of bytes with an optional k, M, G, T, P or E suffix",
        text));
  };
  auto too_large = [&]() {
    return Status::InvalidArgument(
        fmt::format("size '{}' is too large (the largest is 16 EiB - 1 byte)", text));
  };
  size_t i = 0;
  uint64_t whole = 0;
  size_t whole_digits = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    unsigned digit = static_cast<unsigned>(text[i] - '0');
    if (whole > (std::numeric_limits<uint64_t>::max() - digit) / 10) return too_large();
    whole = whole * 10 + digit;
    ++i;
    ++whole_digits;
  }
  std::string_view fraction;
  if (i < text.size() && text[i] == '.') {
    size_t start = ++i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    fraction = text.substr(start, i - start);
    if (fraction.empty()) return invalid();
  }
  if (whole_digits == 0) return invalid();
  unsigned shift = 0;
  if (i < text.size()) {
    switch (text[i]) {
      case 'b': case 'B': shift = 0; break;
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      case 't': case 'T': shift = 40; break;
      case 'p': case 'P': shift = 50; break;
      case 'e': case 'E': shift = 60; break;
      default: return invalid();
    }
    ++i;
  }
  if (i != text.size()) return invalid();
  // A fraction of a byte means nothing; qemu refuses it too.
  if (!fraction.empty() && shift == 0) return invalid();
  if (shift > 0 && whole > (std::numeric_limits<uint64_t>::max() >> shift))
    return too_large();
  uint64_t value = whole << shift;
  if (!fraction.empty()) {
    // fraction * 2^shift, truncated to whole bytes; at most 18 digits are
    // significant enough and keep the arithmetic in range.
    std::string digits(fraction.substr(0, 18));
    uint64_t num = std::stoull(digits);
    uint64_t den = 1;
    for (size_t d = 0; d < digits.size(); ++d) den *= 10;
    long double part = static_cast<long double>(num) / den * std::ldexp(1.0L, shift);
    uint64_t extra = static_cast<uint64_t>(part);
    if (value > std::numeric_limits<uint64_t>::max() - extra) return too_large();
    value += extra;
  }
  return value;
}

Result<std::unique_ptr<RateLimit>> ParseRateLimit(const std::string& text) {
  if (text.empty()) return std::unique_ptr<RateLimit>();
  Result<uint64_t> rate = ParseSize(text);
  if (!rate) {
    return Status::InvalidArgument(fmt::format(
        "invalid rate limit '{}': bytes per second, with an optional k, M, G, T, "
        "P or E suffix (0: no limit)",
        text));
  }
  if (*rate == 0) return std::unique_ptr<RateLimit>();
  return std::make_unique<RateLimit>(*rate);
}

Result<OptionMap> ParseOptionString(std::string_view text) {
  OptionMap options;
  std::string item;
  auto finish_item = [&]() -> Status {
    if (item.empty()) return Status::Ok();
    size_t eq = item.find('=');
    std::string key = item.substr(0, eq);
    if (key.empty()) return Status::InvalidArgument("empty option name in '" + item + "'");
    options[key] = eq == std::string::npos ? "on" : item.substr(eq + 1);
    item.clear();
    return Status::Ok();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',') {
      if (i + 1 < text.size() && text[i + 1] == ',') {  // ",," is a literal comma
        item += ',';
        ++i;
        continue;
      }
      TD_RETURN_IF_ERROR(finish_item());
    } else {
      item += text[i];
    }
  }
  TD_RETURN_IF_ERROR(finish_item());
  return options;
}

Result<bool> ParseOnOff(const std::string& key, const std::string& value) {
  if (value == "on" || value == "true" || value == "yes") return true;
  if (value == "off" || value == "false" || value == "no") return false;
  return Status::InvalidArgument("option '" + key + "' expects 'on' or 'off', not '" + value +
                                 "'");
}

std::string HumanSize(uint64_t bytes) {
  // qemu's size_to_str: pick the unit so the value stays below ~1000, print
  // three significant digits.
  static const char* const kSuffixes[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  int exponent = 0;
  std::frexp(static_cast<double>(bytes) / (1000.0 / 1024.0), &exponent);
  int unit = (exponent - 1) / 10;
  if (unit < 0) unit = 0;
  if (unit > 6) unit = 6;
  double value = static_cast<double>(bytes) / static_cast<double>(1ull << (unit * 10));
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%0.3g %sB", value, kSuffixes[unit]);
  return buf;
}

bool IsAllZero(const uint8_t* buf, size_t size) {
  // Compare in words where possible; the tail byte by byte.
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, buf + i, 8);
    if (word != 0) return false;
  }
  for (; i < size; ++i) {
    if (buf[i] != 0) return false;
  }
  return true;
}

Progress::Progress(bool enabled) : enabled_(enabled) {}

Progress::~Progress() { Finish(); }

void Progress::Update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  double percent = total == 0 ? 100.0 : 100.0 * static_cast<double>(done) / total;
  if (percent - last_percent_ < 0.01 && percent < 100.0) return;
  last_percent_ = percent;
  std::fprintf(stderr, "    (%.2f/100%%)\r", percent);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::Finish() {
  if (!enabled_ || !drawn_) return;
  std::fputc('\n', stderr);
  drawn_ = false;
}

}  // namespace thindisk::cli
