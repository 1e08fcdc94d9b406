// Target (b): the workloads W1-W4 against any NBD server, by URI
// ("nbd+unix:///?socket=/run/x.sock", "nbd://127.0.0.1:10809/export"),
// with `qd` requests in flight on one connection (nbdclient/pipeline.h, in
// the NBD client module). The export is used as found, in order W1, W2, W3, W4: W1
// reads "never-written" space only when the export is fresh.
//
// Host write amplification and server CPU per op come from /proc/PID of
// the server (--server-pid): write_bytes, utime + stime. Space
// amplification needs the served file (--image).
//
// Thread safety: RunRemote is reentrant (one connection per call).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/in_process.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "bench/workload.h"
#include "util/result.h"

namespace thindisk::bench {

// `size` is clipped to the export's size; `workloads` may hold W1-W4 only
// (kInvalidArgument otherwise).
struct RemoteOptions : WorkloadOptions {
  std::string uri;
  pid_t server_pid = 0;    // 0: no server-side figures
  std::string image_path;  // "": no space amplification
};

Result<Report> RunRemote(const RemoteOptions& options);

}  // namespace thindisk::bench
