// Durations given on the command line ("1ms", "500us", "2s", "0"), for
// `thindisk bench --latency`.
//
// Thread safety: pure function.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "util/result.h"

namespace thindisk::bench {

// The longest latency accepted: one request a second is already slower
// than any storage worth measuring, and a typo ("1000s") should not hang a run.
inline constexpr std::chrono::microseconds kMaxLatency = std::chrono::seconds(10);

// Parses a whole number followed by "us", "ms" or "s"; a bare "0" is zero;
// at most `max`.
// Errors (kInvalidArgument) name `option` and the text, e.g.
// "--latency: 'fast' is not a duration (examples: 1ms, 500us, 0)".
Result<std::chrono::microseconds> ParseDuration(
    std::string_view text, std::string_view option,
    std::chrono::microseconds max = kMaxLatency);

// As ParseDuration reads it back, in the largest unit that is exact:
// "10s", "1ms", "500us", "0".
std::string FormatDuration(std::chrono::microseconds d);

}  // namespace thindisk::bench
