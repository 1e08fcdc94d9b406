// The crash suite over RADOS (ctest `crash.rados`, on the test cluster of
// the ceph_cluster fixture): the crash suite's workloads, every named write
// step x every fault, with the qcow2 image living in a fresh rados://
// image per case instead of in memory. FaultyStorage still injects the
// fault and keeps the durable mirror the power cuts are taken from; what
// changes is the code path of every byte: the engine's writes, zeroes,
// punches, resizes and reads go through RadosStorage (split at object
// boundaries, objects that do not exist reading as zeros, the data limit,
// the size kept in the header), and the live state an error leaves behind
// is read back out of the pool and checked like the others. The objects
// are 64 KiB, so requests that span objects, and tables that straddle
// them, are common.
//
//   THINDISK_CRASH_RADOS_WORKLOADS=N  workloads (default kDefaultWorkloads)
//   THINDISK_CRASH_FIRST_SEED=S       the first workload seed (default 1)
//
// A failure prints the case; THINDISK_CRASH_CASE=<id> reruns it here (and
// crash_test reruns it in memory, which tells a RADOS path bug from an
// engine one).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "crash/crash_case.h"
#include "io/rados_storage.h"
#include "io/rados_test_util.h"

namespace thindisk::crash {
namespace {

using io::rados_test::UniqueImage;
using io::rados_test::Uri;

// Seven workloads cover every geometry of the suite once (workload.cc has
// seven).
constexpr uint64_t kDefaultWorkloads = 7;
constexpr uint64_t kObjectSize = 64 << 10;

constexpr FaultKind kFaults[] = {FaultKind::kEio, FaultKind::kEnospc,
                                 FaultKind::kPowerDrop, FaultKind::kPowerSubset,
                                 FaultKind::kPowerTear};

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = getenv(name);
  return v && *v ? strtoull(v, nullptr, 0) : fallback;
}

// A fresh image in the pool, removed when the last holder lets go.
Result<std::shared_ptr<io::Storage>> FreshRadosImage() {
  const std::string name = Uri(UniqueImage("crash"));
  TD_RETURN_IF_ERROR(io::CreateRados(name, 0, kObjectSize));
  TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage, io::OpenRados(name, {}));
  return std::shared_ptr<io::Storage>(storage.release(), [name](io::Storage* s) {
    delete s;
    Status removed = io::RemoveRados(name);
    if (!removed.ok())
      fprintf(stderr, "leftover %s: %s\n", name.c_str(), removed.ToString().c_str());
  });
}

std::string Reproduce(const CaseSpec& spec, const CaseResult& r) {
  char id[40];
  snprintf(id, sizeof id, "0x%llx", static_cast<unsigned long long>(CaseId(spec)));
  return std::string("FAILED over RADOS: ") + Describe(spec) +
         "\n  reproduce with THINDISK_CRASH_CASE=" + id +
         " (crash_rados_test; crash_test runs it "
         "in memory)\n  " +
         r.failure + "\n";
}

// After a failure, whether the cluster still answers: if not, the test says
// so with the cluster's report and the later RADOS tests fail at once.
class CrashOverRados : public ::testing::Test {
 protected:
  void TearDown() override { (void)io::rados_test::ClusterAnswersAfterFailure(); }
};

TEST_F(CrashOverRados, EveryStepEveryFaultKeepsFlushedDataAndMetadata) {
  TD_REQUIRE_CEPH();
  RunOptions opts;
  opts.make_base = FreshRadosImage;
  if (const char* one = getenv("THINDISK_CRASH_CASE"); one && *one) {
    std::optional<CaseSpec> spec = CaseFromId(strtoull(one, nullptr, 0));
    ASSERT_TRUE(spec.has_value()) << "THINDISK_CRASH_CASE=" << one << " names no case";
    CaseResult r = RunCase(*spec, opts);
    printf("case: %s (step %s)\n", Describe(*spec).c_str(),
           r.fault_fired ? "reached" : "not reached");
    EXPECT_TRUE(r.failure.empty()) << Reproduce(*spec, r);
    return;
  }
  const uint64_t workloads = EnvOr("THINDISK_CRASH_RADOS_WORKLOADS", kDefaultWorkloads);
  const uint64_t first_seed = EnvOr("THINDISK_CRASH_FIRST_SEED", 1);
  ASSERT_GE(workloads, 1u);
  const auto start = std::chrono::steady_clock::now();

  std::atomic<uint64_t> next{0}, points{0};
  std::atomic<int> failures{0};
  std::mutex out_mu;
  std::vector<std::string> failed;
  auto worker = [&] {
    for (uint64_t w = next++; w < workloads && failures.load() < 4; w = next++) {
      const uint64_t seed = first_seed + w;
      CaseResult counts = CountEvents(seed, opts);
      if (!counts.failure.empty()) {
        std::lock_guard lock(out_mu);
        failed.push_back(
            Reproduce(CaseSpec{seed, io::Event::kDataWrite, FaultKind::kNone}, counts));
        ++failures;
        continue;
      }
      for (int e = 0; e < io::kEventCount; ++e) {
        for (FaultKind f : kFaults) {
          const CaseSpec spec{seed, io::Event(e), f};
          CaseResult r = RunCase(spec, opts, &counts.events);
          if (!r.fault_fired && r.failure.empty()) continue;  // the step never happens
          ++points;
          if (!r.failure.empty()) {
            std::lock_guard lock(out_mu);
            failed.push_back(Reproduce(spec, r));
            fputs(failed.back().c_str(), stdout);
            ++failures;
          }
        }
      }
    }
  };
  // Each request waits for the cluster: more cases in flight than CPUs.
  std::vector<std::thread> pool;
  for (int i = 0; i < 4; ++i) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  printf("crash points over RADOS: %llu (%llu workloads, %.1f s)\n",
         static_cast<unsigned long long>(points.load()),
         static_cast<unsigned long long>(workloads), secs);
  EXPECT_TRUE(failed.empty()) << failed.size() << " failing cases; first:\n"
                              << failed.front();
  EXPECT_GE(points.load(), workloads * 10)
      << "too few crash points: steps not announced?";
}

}  // namespace
}  // namespace thindisk::crash
