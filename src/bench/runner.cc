#include "bench/runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace thindisk::bench {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t NanosSince(Clock::time_point t) {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

}  // namespace

double NowSeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

Result<PhaseRun> RunThreaded(const std::vector<Op>& ops, uint32_t qd, uint64_t seed,
                             const RunLimits& limits, const ProgressFn& progress, const OpFn& fn,
                             const std::function<Status()>& finish) {
  qd = std::max<uint32_t>(qd, 1);
  uint64_t total = ops.size();
  if (limits.max_ops != 0) total = std::min(total, limits.max_ops);
  uint32_t max_len = 0;
  for (const Op& op : ops) max_len = std::max(max_len, op.length);

  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> stop{false};
  std::mutex error_mu;
  Status first_error;
  std::vector<LatencyLog> logs(qd);
  // Workers still running; the last one to leave wakes the progress loop,
  // so the phase ends when its work does, not at the next progress tick.
  std::mutex running_mu;
  std::condition_variable all_done;
  uint32_t running = qd;
  const Clock::time_point start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(limits.max_seconds));

  auto worker = [&](uint32_t index) {
    std::vector<uint8_t> scratch(max_len);
    FillRandom(seed * 1000003 + index, scratch);
    LatencyLog& log = logs[index];
    log.Reserve(total / qd + 1);
    while (!stop.load(std::memory_order_relaxed)) {
      // The deadline is checked before taking an index, so the executed ops
      // are always a prefix of the list.
      if (limits.max_seconds > 0 && Clock::now() >= deadline) break;
      uint64_t i = next.fetch_add(1);
      if (i >= total) break;
      const Op& op = ops[i];
      Clock::time_point t = Clock::now();
      Status s = fn(op, std::span<uint8_t>(scratch.data(), op.length));
      if (!s.ok()) {
        std::lock_guard lock(error_mu);
        if (first_error.ok()) {
          first_error = s.WithContext("request at offset " + std::to_string(op.offset));
        }
        stop = true;
        break;
      }
      log.Add(NanosSince(t));
      bytes += op.length;
      ++done;
    }
    std::lock_guard lock(running_mu);
    if (--running == 0) all_done.notify_all();
  };

  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < qd; ++i) threads.emplace_back(worker, i);
  if (progress) {
    std::unique_lock lock(running_mu);
    while (!all_done.wait_for(lock, std::chrono::milliseconds(100), [&] { return running == 0; })) {
      lock.unlock();
      progress(done.load(), total);
      lock.lock();
    }
  }
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) return first_error;

  PhaseRun run;
  run.executed = done.load();
  run.bytes = bytes.load();
  if (finish) {
    Clock::time_point f = Clock::now();
    TD_RETURN_IF_ERROR(finish());
    run.finish_seconds = double(NanosSince(f)) / 1e9;
  }
  run.seconds = double(NanosSince(start)) / 1e9;
  for (const LatencyLog& log : logs) run.latencies.Merge(log);
  if (progress) progress(total, total);
  return run;
}

}  // namespace thindisk::bench
