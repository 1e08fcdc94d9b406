// The crash suite (ctest label `crash`): every named write step of the
// qcow2 engine x every fault (EIO, ENOSPC, three kinds of power cut) x
// seeded workloads; see docs/write-ordering.md.
//
//   THINDISK_CRASH_SCALE=N       runs N times as many workloads (soaks)
//   THINDISK_CRASH_FIRST_SEED=S  the first workload seed (default 1)
//   THINDISK_CRASH_CASE=<id>     reruns exactly the case a failure printed
//   THINDISK_QEMU_IMG            qemu-img that checks crashed images (default:
//                                the one found at configure time; "" disables)
//   THINDISK_CRASH_QEMU_EVERY=N  one crashed image in N goes through it (1:
//                                every one; default kQemuEvery)
//   CI, THINDISK_REQUIRE_TOOLS   no qemu-img is a failure, not a skip
//   THINDISK_TEST_DENY=qemu-img  as if qemu-img were missing (tests that rule)
// THINDISK_SEED is the serve scripts' seed (tests/serve/lib.sh), not a case
// id: this suite ignores it.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "crash/crash_case.h"
#include "util/capability_test_util.h"

namespace thindisk::crash {
namespace {

constexpr FaultKind kFaults[] = {FaultKind::kEio, FaultKind::kEnospc, FaultKind::kPowerDrop,
                                 FaultKind::kPowerSubset, FaultKind::kPowerTear};
// Workloads in the default run; each yields one case per (step that
// occurs in it) x fault, about 50.
constexpr uint64_t kDefaultWorkloads = 24;
// One crashed image in this many also goes through `qemu-img check`
// (THINDISK_CRASH_QEMU_EVERY overrides it): every one. Measured on a
// shared 2-CPU machine (RelWithDebInfo, two runs, load 3-5): 1 in 50
// (17 images) took 11-32 s wall, 15-24 s CPU; every image (~1090) 31-58 s
// wall, 29-41 s CPU, i.e. +14-17 s CPU, +19-26 s wall. The extra is
// qemu-img itself (uninstrumented) plus writing each image to /tmp, so the
// ASan+UBSan pass pays about the same again: under a minute for both CI
// passes, within the budget. THINDISK_CRASH_QEMU_EVERY=50 gives back the
// quicker local run.
constexpr uint64_t kQemuEvery = 1;

// The value of NAME as a number, `fallback` when unset or empty; nullopt
// when it is not a whole number.
std::optional<uint64_t> EnvU64(const char* name, uint64_t fallback) {
  const char* v = getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const uint64_t n = strtoull(v, &end, 0);
  if (errno != 0 || *end != '\0' || *v == '-') return std::nullopt;
  return n;
}

std::string QemuImg() {
  if (test_env::CapabilityDenied("qemu-img")) return "";
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
  return std::string("FAILED: ") + Describe(spec) + "\n  reproduce with THINDISK_CRASH_CASE=" +
         id + " ctest -L crash (or crash_test)\n  " + r.failure + "\n";
}

// THINDISK_CRASH_CASE: one case, by the id a failure printed.
void RunOneCase(const char* text, const std::string& qemu_img) {
  char* end = nullptr;
  errno = 0;
  const uint64_t id = strtoull(text, &end, 0);
  ASSERT_TRUE(errno == 0 && *end == '\0' && *text != '-')
      << "THINDISK_CRASH_CASE=" << text << " is not a case id (a number such as 0x10b01)";
  std::optional<CaseSpec> spec = CaseFromId(id);
  ASSERT_TRUE(spec.has_value()) << "THINDISK_CRASH_CASE=" << text
                                << " names no case: event < " << io::kEventCount
                                << ", fault < " << kFaultKinds << ", seed <= 2^40-1";
  RunOptions opts;
  opts.qemu_img = qemu_img;
  CaseResult r = RunCase(*spec, opts);
  printf("case: %s (step %s)\n", Describe(*spec).c_str(),
         r.fault_fired ? "reached" : "not reached");
  printf("crash points: %d\n", r.fault_fired ? 1 : 0);
  EXPECT_TRUE(r.failure.empty()) << Reproduce(*spec, r);
  // A fault that never fires checks nothing (kNone is the dry run itself).
  EXPECT_TRUE(r.fault_fired || spec->fault == FaultKind::kNone || !r.failure.empty())
      << Describe(*spec) << ": the step never happens in this workload; nothing was checked";
}

TEST(CaseIdTest, RoundTripsAndRejectsIdsThatNameNoCase) {
  const CaseSpec last{kMaxWorkloadSeed, io::Event(io::kEventCount - 1), FaultKind::kPowerTear};
  for (const CaseSpec& spec : {CaseSpec{1, io::Event::kL2Update, FaultKind::kEio}, last}) {
    std::optional<CaseSpec> back = CaseFromId(CaseId(spec));
    ASSERT_TRUE(back.has_value()) << Describe(spec);
    EXPECT_EQ(back->workload_seed, spec.workload_seed);
    EXPECT_EQ(back->event, spec.event);
    EXPECT_EQ(back->fault, spec.fault);
  }
  const uint64_t ok = CaseId(CaseSpec{12, io::Event::kL1Update, FaultKind::kEnospc});
  EXPECT_FALSE(CaseFromId((ok & ~0xff00ull) | uint64_t(io::kEventCount) << 8));
  EXPECT_FALSE(CaseFromId((ok & ~0xff00ull) | 0xff00ull));
  EXPECT_FALSE(CaseFromId((ok & ~0xffull) | uint64_t(kFaultKinds)));
  EXPECT_FALSE(CaseFromId(CaseId(CaseSpec{kMaxWorkloadSeed + 1, io::Event::kL1Update,
                                          FaultKind::kEnospc})));
  EXPECT_FALSE(CaseFromId(20261130));  // stress.sh's seed, 0x1352a0a: event 0x2a
}

TEST(CrashSuite, EveryStepEveryFaultKeepsFlushedDataAndMetadata) {
  const std::string qemu_img = QemuImg();
  if (qemu_img.empty()) {
    // Not a skip: the rest of the suite needs no tool.
    if (test_env::CapabilitiesRequired()) {
      FAIL() << "no qemu-img to check crashed images (not found at configure time, "
                "THINDISK_QEMU_IMG empty, or THINDISK_TEST_DENY=qemu-img) and "
                "CI/THINDISK_REQUIRE_TOOLS is set";
    }
    printf("qemu-img: none; crashed images are not checked by qemu-img\n");
  }
  if (const char* one = getenv("THINDISK_CRASH_CASE"); one && *one) {
    RunOneCase(one, qemu_img);
    return;
  }
  if (const char* seed = getenv("THINDISK_SEED"); seed && *seed) {
    printf("THINDISK_SEED=%s ignored: it seeds the serve scripts; rerun a crash case with "
           "THINDISK_CRASH_CASE=<id>\n", seed);
  }
  const std::optional<uint64_t> scale = EnvU64("THINDISK_CRASH_SCALE", 1);
  const std::optional<uint64_t> first = EnvU64("THINDISK_CRASH_FIRST_SEED", 1);
  const std::optional<uint64_t> qemu_every = EnvU64("THINDISK_CRASH_QEMU_EVERY", kQemuEvery);
  ASSERT_TRUE(scale && first && qemu_every)
      << "THINDISK_CRASH_SCALE, THINDISK_CRASH_FIRST_SEED and THINDISK_CRASH_QEMU_EVERY "
         "must be whole numbers";
  ASSERT_GE(*qemu_every, 1u) << "THINDISK_CRASH_QEMU_EVERY=1 checks every image";
  const uint64_t workloads = kDefaultWorkloads * std::max<uint64_t>(1, *scale);
  const uint64_t first_seed = *first;
  ASSERT_LE(first_seed + workloads - 1, kMaxWorkloadSeed) << "THINDISK_CRASH_FIRST_SEED too large";
  if (!qemu_img.empty()) {
    printf("qemu-img check: one crashed image in %llu\n",
           static_cast<unsigned long long>(*qemu_every));
  }
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
          if (!qemu_img.empty() &&
              (CaseId(spec) * 0x9e3779b97f4a7c15ull >> 32) % *qemu_every == 0) {
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
  if (!qemu_img.empty() && *qemu_every == 1) {
    EXPECT_EQ(qemu_checked.load(), points.load()) << "crashed images qemu-img did not check";
  } else if (!qemu_img.empty()) {
    // At least half the sample's share (the hash is not exact): a sample
    // that checks nothing must not pass.
    EXPECT_GE(qemu_checked.load() * 2 * *qemu_every, points.load())
        << "qemu-img checked too few images";
  }
}

}  // namespace
}  // namespace thindisk::crash
