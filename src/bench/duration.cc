#include "bench/duration.h"

#include <charconv>
#include <string>

namespace thindisk::bench {

Result<std::chrono::microseconds> ParseDuration(std::string_view text,
                                                std::string_view option,
                                                std::chrono::microseconds max) {
  constexpr std::string_view kNotADuration =
      "is not a duration (examples: 1ms, 500us, 0)";
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(std::string(option) + ": '" + std::string(text) +
                                   "' " + std::string(why));
  };
  const std::string too_long = "is too long (at most " + FormatDuration(max) + ")";
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec == std::errc::result_out_of_range) return bad(too_long);
  if (ec != std::errc() || end == text.data()) return bad(kNotADuration);
  std::string_view unit(end, size_t(text.data() + text.size() - end));
  uint64_t per_unit = 0;
  if (unit == "us") {
    per_unit = 1;
  } else if (unit == "ms") {
    per_unit = 1000;
  } else if (unit == "s") {
    per_unit = 1000000;
  } else if (unit.empty() && n == 0) {
    return std::chrono::microseconds(0);
  } else if (unit.empty()) {
    return bad("needs a unit: us, ms or s");
  } else {
    return bad(kNotADuration);
  }
  // Checked before multiplying, so a huge count cannot wrap around.
  if (n > uint64_t(max.count()) / per_unit) return bad(too_long);
  return std::chrono::microseconds(int64_t(n * per_unit));
}

std::string FormatDuration(std::chrono::microseconds d) {
  int64_t us = d.count();
  if (us == 0) return "0";
  if (us % 1000000 == 0) return std::to_string(us / 1000000) + "s";
  if (us % 1000 == 0) return std::to_string(us / 1000) + "ms";
  return std::to_string(us) + "us";
}

}  // namespace thindisk::bench
