#include "cli/snapshot_table.h"

#include <cstdio>
#include <ctime>
#include <string>

#include "cli/common.h"
#include "qcow2/snapshot.h"

namespace thindisk::cli {
namespace {

uint64_t VmStateSize(const qcow2::Snapshot& sn) {
  return sn.extra.size() >= 8 ? sn.vm_state_size_large : sn.vm_state_size;
}

}  // namespace

void PrintSnapshotTable(const std::vector<qcow2::Snapshot>& snapshots) {
  std::printf("Snapshot list:\n%-10s%-17s%8s%20s%13s%11s\n", "ID", "TAG", "VM SIZE",
              "DATE", "VM CLOCK", "ICOUNT");
  for (const qcow2::Snapshot& sn : snapshots) {
    time_t t = sn.date_sec;
    struct tm tm {};
    localtime_r(&t, &tm);
    char date[32];
    std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", &tm);
    unsigned long long ms = sn.vm_clock_nsec / 1000000ull;
    char clock[48];
    std::snprintf(clock, sizeof(clock), "%02llu:%02llu:%02llu.%03llu", ms / 3600000,
                  ms / 60000 % 60, ms / 1000 % 60, ms % 1000);
    auto icount = qcow2::SnapshotIcount(sn);
    std::string icount_text = icount ? std::to_string(*icount) : "";
    std::printf("%-9s %-16s %8s%20s%13s%11s\n", sn.id.c_str(), sn.name.c_str(),
                HumanSize(VmStateSize(sn)).c_str(), date, clock, icount_text.c_str());
  }
}

nlohmann::ordered_json SnapshotJson(const qcow2::Snapshot& sn) {
  nlohmann::ordered_json j;
  if (auto icount = qcow2::SnapshotIcount(sn)) j["icount"] = *icount;
  j["vm-clock-nsec"] = sn.vm_clock_nsec % 1000000000ull;
  j["name"] = sn.name;
  j["date-sec"] = sn.date_sec;
  j["date-nsec"] = sn.date_nsec;
  j["vm-clock-sec"] = sn.vm_clock_nsec / 1000000000ull;
  j["id"] = sn.id;
  j["vm-state-size"] = VmStateSize(sn);
  return j;
}

}  // namespace thindisk::cli
