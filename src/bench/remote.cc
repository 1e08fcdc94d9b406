#include "bench/remote.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "bench/bench_image.h"
#include "bench/proc_stats.h"
#include "nbdclient/nbd_module.h"

namespace thindisk::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kSmallBlock = 4096;
constexpr uint32_t kLargeBlock = 1 << 20;

// Runs `ops` (up to limits.max_ops, within limits.max_seconds) with `qd`
// in flight on `pipe`, then flushes after writes when the export takes
// flushes.
Result<PhaseRun> RunOps(nbdclient::Pipeline& pipe, bool writes, const std::vector<Op>& ops,
                        uint32_t qd, uint64_t seed, const RunLimits& limits,
                        const ProgressFn& progress) {
  qd = std::max<uint32_t>(qd, 1);
  uint64_t total = ops.size();
  if (limits.max_ops != 0) total = std::min(total, limits.max_ops);
  uint32_t max_len = 0;
  for (const Op& op : ops) max_len = std::max(max_len, op.length);
  std::vector<std::vector<uint8_t>> buffers(qd);
  for (uint32_t i = 0; i < qd; ++i) {
    buffers[i].resize(max_len);
    FillRandom(seed * 1000003 + i, buffers[i]);
  }
  const Clock::time_point start = Clock::now();
  uint64_t next = 0;
  PhaseRun run;
  nbdclient::Pipeline::Calls calls;
  calls.next = [&](nbdclient::PipelineRequest& r) {
    if (next >= total) return false;
    if (limits.max_seconds > 0 &&
        std::chrono::duration<double>(Clock::now() - start).count() >= limits.max_seconds)
      return false;
    const Op& op = ops[next++];
    r.offset = op.offset;
    r.length = op.length;
    return true;
  };
  calls.done = [&](const nbdclient::PipelineRequest& r, uint64_t nanos) {
    run.latencies.Add(nanos);
    run.bytes += r.length;
    ++run.executed;
  };
  if (progress) calls.tick = [&] { progress(run.executed, total); };
  TD_RETURN_IF_ERROR(pipe.Run(writes, buffers, calls));
  if (writes && pipe.can_flush()) {
    const Clock::time_point f = Clock::now();
    TD_RETURN_IF_ERROR(pipe.Flush());
    run.finish_seconds = std::chrono::duration<double>(Clock::now() - f).count();
  }
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (progress) progress(total, total);
  return run;
}

struct Costs {
  bool have_server = false;
  ProcessCost server;
  Result<uint64_t> allocated = Status::NotFound("no --image");
};

Result<Costs> Sample(const RemoteOptions& o) {
  Costs c;
  if (o.server_pid > 0) {
    TD_ASSIGN_OR_RETURN(c.server, ReadProcessCost(o.server_pid));
    c.have_server = true;
  }
  if (!o.image_path.empty()) {
    c.allocated = AllocatedFileBytes(o.image_path);
    if (!c.allocated.has_value()) return c.allocated.error();
  }
  return c;
}

Result<WorkloadResult> Phase(nbdclient::Pipeline& pipe, const RemoteOptions& o, Workload w, bool writes,
                             const std::vector<Op>& ops, uint64_t footprint, PhaseRun* run_out) {
  std::string variant = "qd" + std::to_string(o.qd);
  ProgressFn progress;
  if (o.progress) {
    std::string label = std::string(WorkloadId(w)) + " " + variant;
    progress = [&o, label](uint64_t done, uint64_t total) { o.progress(label, done, total); };
  }
  TD_ASSIGN_OR_RETURN(Costs before, Sample(o));
  TD_ASSIGN_OR_RETURN(PhaseRun run, RunOps(pipe, writes, ops, o.qd, o.seed, o.limits, progress));
  TD_ASSIGN_OR_RETURN(Costs after, Sample(o));
  WorkloadResult r;
  r.id = std::string(WorkloadId(w));
  r.title = std::string(WorkloadTitle(w));
  r.variant = variant;
  r.qd = o.qd;
  r.figures = run.Figures();
  r.flush_seconds = run.finish_seconds;
  if (after.have_server && run.executed > 0) {
    r.cpu_us_per_op = (after.server.cpu_seconds - before.server.cpu_seconds) * 1e6 / double(run.executed);
    r.cpu_source = "server";
    if (writes && run.bytes > 0) {
      uint64_t host = after.server.write_bytes - before.server.write_bytes;
      r.host_bytes_written = host;
      r.write_amplification = double(host) / double(run.bytes);
    }
  }
  if (after.allocated.has_value()) {
    r.allocated_bytes = *after.allocated;
    if (writes && run.bytes > 0) {
      uint64_t guest = footprint ? std::min(footprint, run.bytes) : run.bytes;
      r.space_amplification = double(*after.allocated) / double(guest);
    }
  }
  if (run_out) *run_out = std::move(run);
  return r;
}

}  // namespace

Result<Report> RunRemote(const RemoteOptions& o) {
  for (Workload w : o.workloads) {
    if (w == Workload::kW5CloneWrite || w == Workload::kW6Compress) {
      return Status::InvalidArgument(std::string(WorkloadId(w)) +
                                     " creates images, so it runs in-process only (drop --uri)");
    }
    if (w == Workload::kW9RandRead) {
      return Status::InvalidArgument("W9 runs in-process only (drop --uri)");
    }
  }
  TD_ASSIGN_OR_RETURN(std::unique_ptr<nbdclient::Pipeline> pipe,
                      nbdclient::nbd_module::OpenPipeline(o.uri));
  RemoteOptions clipped = o;
  clipped.size = std::min(o.size, pipe->size());
  clipped.size -= clipped.size % kSmallBlock;
  if (clipped.size == 0) return Status::InvalidArgument(o.uri + ": export smaller than 4 KiB");
  auto wants = [&](Workload w) { return std::find(o.workloads.begin(), o.workloads.end(), w) != o.workloads.end(); };
  bool any_write = wants(Workload::kW2FirstWrite) || wants(Workload::kW3Rewrite) || wants(Workload::kW4SeqWrite);
  if (any_write && pipe->read_only()) {
    return Status::ReadOnly(o.uri + ": the export is read-only; W2-W4 write (use --workloads W1)");
  }

  Report report;
  report.target = o.uri;
  report.size = clipped.size;
  report.qd = o.qd;
  report.seed = o.seed;
  if (wants(Workload::kW1SeqRead)) {
    TD_ASSIGN_OR_RETURN(WorkloadResult r, Phase(*pipe, clipped, Workload::kW1SeqRead, false,
                                                SequentialOps(0, clipped.size, kLargeBlock), 0, nullptr));
    report.results.push_back(std::move(r));
  }
  if (wants(Workload::kW2FirstWrite) || wants(Workload::kW3Rewrite)) {
    std::vector<Op> ops = RandomOps(clipped.size, kSmallBlock, o.seed);
    PhaseRun first;
    TD_ASSIGN_OR_RETURN(WorkloadResult r,
                        Phase(*pipe, clipped, Workload::kW2FirstWrite, true, ops, 0, &first));
    if (wants(Workload::kW2FirstWrite)) report.results.push_back(std::move(r));
    if (wants(Workload::kW3Rewrite)) {
      std::vector<Op> again(ops.begin(), ops.begin() + ptrdiff_t(first.executed));
      TD_ASSIGN_OR_RETURN(WorkloadResult r3, Phase(*pipe, clipped, Workload::kW3Rewrite, true, again,
                                                   first.bytes, nullptr));
      report.results.push_back(std::move(r3));
    }
  }
  if (wants(Workload::kW4SeqWrite)) {
    TD_ASSIGN_OR_RETURN(WorkloadResult r, Phase(*pipe, clipped, Workload::kW4SeqWrite, true,
                                                SequentialOps(0, clipped.size, kLargeBlock), 0, nullptr));
    report.results.push_back(std::move(r));
  }
  return report;
}

}  // namespace thindisk::bench
