// The crash suite (ctest label `crash`): every named write step of the
// qcow2 engine x every fault (EIO, ENOSPC, three kinds of power cut) x
// seeded workloads; see docs/write-ordering.md.
//
//   THINDISK_CRASH_SCALE=N  runs N times as many workloads (soaks)
//   THINDISK_SEED=<id>      reruns exactly the case a failure printed
//   THINDISK_QEMU_IMG       qemu-img to check a sample of crashed images
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "crash/crash_case.h"

namespace thindisk::crash {
namespace {

constexpr FaultKind kFaults[] = {FaultKind::kEio, FaultKind::kEnospc, FaultKind::kPowerDrop,
                                 FaultKind::kPowerSubset, FaultKind::kPowerTear};
// Workloads in the default run; each yields one case per (step that
// occurs in it) x fault, about 50.
constexpr uint64_t kDefaultWorkloads = 24;
// One crashed image in this many also goes through `qemu-img check`.
constexpr uint64_t kQemuSample = 50;

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* v = getenv(name);
  if (!v || !*v) return fallback;
  return strtoull(v, nullptr, 0);
}

std::string QemuImg() {
  const char* v = getenv("THINDISK_QEMU_IMG");
  if (v) return v;  // empty: disabled
#ifdef THINDISK_QEMU_IMG_PATH
  return THINDISK_QEMU_IMG_PATH;
#else
  return "";
#endif
}

std::string Reproduce(const CaseSpec& spec, const CaseResult& r) {
  char id[40];
  snprintf(id, sizeof id, "0x%llx", static_cast<unsigned long long>(CaseId(spec)));
  return std::string("FAILED: ") + Describe(spec) + "\n  reproduce with THINDISK_SEED=" + id +
         " ctest -L crash (or crash_test)\n  " + r.failure + "\n";
}

TEST(CrashSuite, EveryStepEveryFaultKeepsFlushedDataAndMetadata) {
  const std::string qemu_img = QemuImg();
  if (const char* one = getenv("THINDISK_SEED"); one && *one) {
    CaseSpec spec = CaseFromId(strtoull(one, nullptr, 0));
    RunOptions opts;
    opts.qemu_img = qemu_img;
    CaseResult r = RunCase(spec, opts);
    printf("case: %s (step %s)\n", Describe(spec).c_str(),
           r.fault_fired ? "reached" : "not reached");
    printf("crash points: %d\n", r.fault_fired ? 1 : 0);
    EXPECT_TRUE(r.failure.empty()) << Reproduce(spec, r);
    return;
  }
  const uint64_t workloads = kDefaultWorkloads * std::max<uint64_t>(1, EnvU64("THINDISK_CRASH_SCALE", 1));
  const uint64_t first_seed = EnvU64("THINDISK_CRASH_FIRST_SEED", 1);
  const auto start = std::chrono::steady_clock::now();

  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> points{0};
  std::array<std::atomic<uint64_t>, io::kEventCount> per_step{};
  std::atomic<uint64_t> qemu_checked{0};
  std::atomic<int> failures{0};
  std::mutex out_mu;
  std::vector<std::string> failed;
  auto worker = [&] {
    for (uint64_t w = next++; w < workloads && failures.load() < 8; w = next++) {
      const uint64_t seed = first_seed + w;
      if (workloads >= 100 && w % (workloads / 10) == 0) {
        printf("progress: workload %llu of %llu, %llu crash points so far\n",
               static_cast<unsigned long long>(w), static_cast<unsigned long long>(workloads),
               static_cast<unsigned long long>(points.load()));
        fflush(stdout);
      }
      CaseResult counts = CountEvents(seed);
      if (!counts.failure.empty()) {
        CaseSpec spec{seed, io::Event::kDataWrite, FaultKind::kNone};
        std::lock_guard lock(out_mu);
        failed.push_back(Reproduce(spec, counts));
        ++failures;
        continue;
      }
      for (int e = 0; e < io::kEventCount; ++e) {
        for (FaultKind f : kFaults) {
          CaseSpec spec{seed, io::Event(e), f};
          RunOptions opts;
          if (!qemu_img.empty() && (CaseId(spec) * 0x9e3779b97f4a7c15ull >> 32) % kQemuSample == 0) {
            opts.qemu_img = qemu_img;
          }
          CaseResult r = RunCase(spec, opts, &counts.events);
          if (!r.fault_fired && r.failure.empty()) continue;  // the step never happens
          ++points;
          ++per_step[e];
          if (r.qemu_img_checked) ++qemu_checked;
          if (!r.failure.empty()) {
            std::lock_guard lock(out_mu);
            failed.push_back(Reproduce(spec, r));
            fputs(failed.back().c_str(), stdout);
            fflush(stdout);
            ++failures;
          }
        }
      }
    }
  };
  std::vector<std::thread> pool;
  unsigned n = std::max(2u, std::min(4u, std::thread::hardware_concurrency()));
  for (unsigned i = 0; i < n; ++i) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  printf("crash points: %llu (%llu workloads, %llu images also checked by qemu-img, %.1f s)\n",
         static_cast<unsigned long long>(points.load()),
         static_cast<unsigned long long>(workloads),
         static_cast<unsigned long long>(qemu_checked.load()), secs);
  printf("per step:");
  for (int e = 0; e < io::kEventCount; ++e) {
    printf(" %s=%llu", io::EventName(io::Event(e)),
           static_cast<unsigned long long>(per_step[e].load()));
  }
  printf("\n");
  EXPECT_TRUE(failed.empty()) << failed.size() << " failing cases; first:\n" << failed.front();
  EXPECT_GE(points.load(), workloads * 20) << "too few crash points: steps not announced?";
}

}  // namespace
}  // namespace thindisk::crash
