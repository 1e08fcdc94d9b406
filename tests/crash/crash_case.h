// One crash case of the crash suite: a seeded workload on a qcow2 image
// over FaultyStorage(MemoryStorage), a fault at one named write step
// (io::Event), then the checks of docs/write-ordering.md "What the crash
// suite proves" on every state the crash leaves behind.
//
// A case is fully named by one 64-bit number (CaseId), printed on failure
// and accepted back through THINDISK_CRASH_CASE. Single-threaded workloads
// replay exactly; a workload with 2-4 threads replays the same requests,
// in a schedule the OS picks.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "io/storage.h"

namespace thindisk::crash {

enum class FaultKind : uint8_t {
  kNone,         // no fault: the workload alone (a dry run counts events)
  kEio,          // the write after the step fails with EIO (once or, for odd seeds, for good)
  kEnospc,       // the write after the step fails with ENOSPC, and every later one
  kPowerDrop,    // power cut at the step; unflushed writes lost
  kPowerSubset,  // power cut at the step; a random subset of unflushed writes kept
  kPowerTear,    // power cut during the step's write: unflushed writes kept, it torn
};
inline constexpr int kFaultKinds = 6;
const char* FaultName(FaultKind k);

inline constexpr uint64_t kMaxWorkloadSeed = (uint64_t(1) << 40) - 1;

struct CaseSpec {
  uint64_t workload_seed = 0;  // <= kMaxWorkloadSeed
  io::Event event = io::Event::kDataWrite;
  FaultKind fault = FaultKind::kNone;
};
// seed << 16 | event << 8 | fault.
uint64_t CaseId(const CaseSpec& spec);
// The case an id names; nullopt when it names none (an event >= kEventCount,
// a fault >= kFaultKinds or a seed > kMaxWorkloadSeed: a mistyped id), so
// the decoded event can index per-event arrays.
std::optional<CaseSpec> CaseFromId(uint64_t id);
std::string Describe(const CaseSpec& spec);  // "seed 12, l2_update, eio"

struct RunOptions {
  // When non-empty, the crashed image (and its backing file) is written to
  // a temporary directory and `qemu-img check` must exit 0 or 3.
  std::string qemu_img;
  // The storage the image is created on and the workload runs over, under
  // the FaultyStorage that injects the fault and keeps the durable mirror;
  // null: a MemoryStorage. The RADOS suite passes a fresh rados:// image
  // (crash_rados_test.cc), so the engine's writes go through RadosStorage
  // and the live state a fault leaves is read back out of the pool. Called
  // once per run (the dry run that counts steps included).
  std::function<Result<std::shared_ptr<io::Storage>>()> make_base;
};

struct CaseResult {
  std::string failure;          // empty when every check passed
  bool fault_fired = false;     // the armed step occurred
  bool qemu_img_checked = false;
  std::array<uint64_t, io::kEventCount> events{};  // announcements seen
};

// Runs one case. Which announcement of the step fails is picked (from the
// case id) among those of a fault-free run of the same workload, whose
// counts `counts` gives (null: runs it first; see CountEvents).
CaseResult RunCase(const CaseSpec& spec, const RunOptions& options,
                   const std::array<uint64_t, io::kEventCount>* counts = nullptr);
// The fault-free run: announcements per step (failure set if even that
// run fails).
CaseResult CountEvents(uint64_t workload_seed, const RunOptions& options = {});

}  // namespace thindisk::crash
