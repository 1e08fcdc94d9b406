#include "bench/remote.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "bench/bench_image.h"
#include "bench/proc_stats.h"

#ifdef THINDISK_HAVE_LIBNBD
#include <libnbd.h>
#endif

namespace thindisk::bench {

#ifndef THINDISK_HAVE_LIBNBD

bool HaveNbdClient() { return false; }

Result<Report> RunRemote(const RemoteOptions&) {
  return Status::NotSupported(
      "--uri needs libnbd, and this thindisk was built without it (install libnbd-dev and "
      "reconfigure)");
}

#else

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kSmallBlock = 4096;
constexpr uint32_t kLargeBlock = 1 << 20;

Status NbdError(const std::string& what) {
  const char* msg = nbd_get_error();
  int e = nbd_get_errno();
  return Status(Code::kIoError, what + ": " + (msg ? msg : "unknown libnbd error"), e);
}

// One libnbd handle; requests are kept in flight with nbd_aio_* and
// completed by nbd_poll on this thread, so no locking is needed.
class Connection {
 public:
  static Result<std::unique_ptr<Connection>> Open(const std::string& uri) {
    std::unique_ptr<Connection> c(new Connection());
    c->h_ = nbd_create();
    if (c->h_ == nullptr) return NbdError("nbd_create");
    // nbds:// URIs name their credentials as local files (tls-certificates=,
    // tls-psk-file=); the URI is the user's own.
    if (nbd_set_uri_allow_local_file(c->h_, true) == -1) return NbdError(uri);
    if (nbd_connect_uri(c->h_, uri.c_str()) == -1) return NbdError(uri);
    int64_t size = nbd_get_size(c->h_);
    if (size < 0) return NbdError(uri + ": export size");
    c->size_ = uint64_t(size);
    c->read_only_ = nbd_is_read_only(c->h_) == 1;
    c->can_flush_ = nbd_can_flush(c->h_) == 1;
    return c;
  }
  ~Connection() {
    if (h_ != nullptr) {
      nbd_shutdown(h_, 0);
      nbd_close(h_);
    }
  }
  uint64_t size() const { return size_; }
  bool read_only() const { return read_only_; }

  Result<PhaseRun> Run(bool writes, const std::vector<Op>& ops, uint32_t qd, uint64_t seed,
                       const RunLimits& limits, const ProgressFn& progress);

 private:
  struct Slot {
    Connection* owner = nullptr;
    Clock::time_point start;
    uint32_t length = 0;
    std::vector<uint8_t> buf;
  };
  struct State {
    std::vector<Slot*> free;
    LatencyLog log;
    uint64_t done = 0;
    uint64_t bytes = 0;
    int error = 0;
  };

  static int Completed(void* user_data, int* error) {
    auto* slot = static_cast<Slot*>(user_data);
    State& st = *slot->owner->state_;
    if (*error != 0) {
      if (st.error == 0) st.error = *error;
    } else {
      st.log.Add(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - slot->start).count()));
      st.bytes += slot->length;
      ++st.done;
    }
    st.free.push_back(slot);
    return 1;  // retire the command
  }

  Connection() = default;
  nbd_handle* h_ = nullptr;
  uint64_t size_ = 0;
  bool read_only_ = false;
  bool can_flush_ = false;
  State* state_ = nullptr;
};

Result<PhaseRun> Connection::Run(bool writes, const std::vector<Op>& ops, uint32_t qd, uint64_t seed,
                                 const RunLimits& limits, const ProgressFn& progress) {
  qd = std::max<uint32_t>(qd, 1);
  uint64_t total = ops.size();
  if (limits.max_ops != 0) total = std::min(total, limits.max_ops);
  uint32_t max_len = 0;
  for (const Op& op : ops) max_len = std::max(max_len, op.length);
  std::vector<Slot> slots(qd);
  State st;
  for (uint32_t i = 0; i < qd; ++i) {
    slots[i].owner = this;
    slots[i].buf.resize(max_len);
    FillRandom(seed * 1000003 + i, slots[i].buf);
    st.free.push_back(&slots[i]);
  }
  state_ = &st;
  const Clock::time_point start = Clock::now();
  Clock::time_point last_progress = start;
  uint64_t next = 0;
  Status error;
  while (error.ok()) {
    bool expired = limits.max_seconds > 0 &&
                   std::chrono::duration<double>(Clock::now() - start).count() >= limits.max_seconds;
    while (!st.free.empty() && next < total && !expired && st.error == 0) {
      Slot* slot = st.free.back();
      st.free.pop_back();
      const Op& op = ops[next++];
      slot->length = op.length;
      slot->start = Clock::now();
      nbd_completion_callback cb = {Completed, slot, nullptr};
      int64_t cookie = writes ? nbd_aio_pwrite(h_, slot->buf.data(), op.length, op.offset, cb, 0)
                              : nbd_aio_pread(h_, slot->buf.data(), op.length, op.offset, cb, 0);
      if (cookie == -1) {
        error = NbdError("request at offset " + std::to_string(op.offset));
        st.free.push_back(slot);
        break;
      }
    }
    if (st.error != 0 && error.ok()) error = Status::FromErrno(st.error, "NBD request failed");
    if (st.free.size() == qd && (next >= total || expired || !error.ok())) break;
    if (nbd_poll(h_, 100) == -1 && error.ok()) error = NbdError("nbd_poll");
    if (progress && Clock::now() - last_progress > std::chrono::milliseconds(100)) {
      last_progress = Clock::now();
      progress(st.done, total);
    }
  }
  // Drain whatever is still in flight after an error before the slots go away.
  while (st.free.size() < qd && nbd_poll(h_, 1000) != -1) {
  }
  state_ = nullptr;
  if (!error.ok()) return error;
  PhaseRun run;
  run.executed = st.done;
  run.bytes = st.bytes;
  if (writes && can_flush_) {
    Clock::time_point f = Clock::now();
    if (nbd_flush(h_, 0) == -1) return NbdError("flush");
    run.finish_seconds = std::chrono::duration<double>(Clock::now() - f).count();
  }
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  run.latencies = std::move(st.log);
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

Result<WorkloadResult> Phase(Connection& conn, const RemoteOptions& o, Workload w, bool writes,
                             const std::vector<Op>& ops, uint64_t footprint, PhaseRun* run_out) {
  std::string variant = "qd" + std::to_string(o.qd);
  ProgressFn progress;
  if (o.progress) {
    std::string label = std::string(WorkloadId(w)) + " " + variant;
    progress = [&o, label](uint64_t done, uint64_t total) { o.progress(label, done, total); };
  }
  TD_ASSIGN_OR_RETURN(Costs before, Sample(o));
  TD_ASSIGN_OR_RETURN(PhaseRun run, conn.Run(writes, ops, o.qd, o.seed, o.limits, progress));
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

bool HaveNbdClient() { return true; }

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
  TD_ASSIGN_OR_RETURN(std::unique_ptr<Connection> conn, Connection::Open(o.uri));
  RemoteOptions clipped = o;
  clipped.size = std::min(o.size, conn->size());
  clipped.size -= clipped.size % kSmallBlock;
  if (clipped.size == 0) return Status::InvalidArgument(o.uri + ": export smaller than 4 KiB");
  auto wants = [&](Workload w) { return std::find(o.workloads.begin(), o.workloads.end(), w) != o.workloads.end(); };
  bool any_write = wants(Workload::kW2FirstWrite) || wants(Workload::kW3Rewrite) || wants(Workload::kW4SeqWrite);
  if (any_write && conn->read_only()) {
    return Status::ReadOnly(o.uri + ": the export is read-only; W2-W4 write (use --workloads W1)");
  }

  Report report;
  report.target = o.uri;
  report.size = clipped.size;
  report.qd = o.qd;
  report.seed = o.seed;
  if (wants(Workload::kW1SeqRead)) {
    TD_ASSIGN_OR_RETURN(WorkloadResult r, Phase(*conn, clipped, Workload::kW1SeqRead, false,
                                                SequentialOps(0, clipped.size, kLargeBlock), 0, nullptr));
    report.results.push_back(std::move(r));
  }
  if (wants(Workload::kW2FirstWrite) || wants(Workload::kW3Rewrite)) {
    std::vector<Op> ops = RandomOps(clipped.size, kSmallBlock, o.seed);
    PhaseRun first;
    TD_ASSIGN_OR_RETURN(WorkloadResult r,
                        Phase(*conn, clipped, Workload::kW2FirstWrite, true, ops, 0, &first));
    if (wants(Workload::kW2FirstWrite)) report.results.push_back(std::move(r));
    if (wants(Workload::kW3Rewrite)) {
      std::vector<Op> again(ops.begin(), ops.begin() + ptrdiff_t(first.executed));
      TD_ASSIGN_OR_RETURN(WorkloadResult r3, Phase(*conn, clipped, Workload::kW3Rewrite, true, again,
                                                   first.bytes, nullptr));
      report.results.push_back(std::move(r3));
    }
  }
  if (wants(Workload::kW4SeqWrite)) {
    TD_ASSIGN_OR_RETURN(WorkloadResult r, Phase(*conn, clipped, Workload::kW4SeqWrite, true,
                                                SequentialOps(0, clipped.size, kLargeBlock), 0, nullptr));
    report.results.push_back(std::move(r));
  }
  return report;
}

#endif  // THINDISK_HAVE_LIBNBD

}  // namespace thindisk::bench
