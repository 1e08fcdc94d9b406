// What a process has cost the host so far, read from /proc (Linux): CPU
// time (utime + stime) and bytes it sent to the storage layer
// (/proc/PID/io write_bytes). Used to charge a server (--server-pid) or the
// bench process itself for each workload.
//
// Thread safety: reentrant.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "util/result.h"

namespace thindisk::bench {

struct ProcessCost {
  double cpu_seconds = 0;     // user + system, all threads
  uint64_t write_bytes = 0;   // /proc/PID/io write_bytes (0 where unreadable for self)
};

// Costs of process `pid` (all threads). Errors: kNotFound when the process
// is gone, kIoError/kNotSupported when /proc can't be read or parsed (then
// the message names the file).
Result<ProcessCost> ReadProcessCost(pid_t pid);

// Costs of this process: CPU from getrusage (exact), write_bytes from
// /proc/self/io when readable, else 0.
ProcessCost SelfCost();

}  // namespace thindisk::bench
