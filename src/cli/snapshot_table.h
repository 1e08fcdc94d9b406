// The two views of a qcow2 snapshot table that `info` and `snapshot -l`
// share with qemu-img: its "Snapshot list:" table and its JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "qcow2/format.h"

namespace thindisk::cli {

// Prints qemu-img's "Snapshot list:" table (its column widths) to stdout.
void PrintSnapshotTable(const std::vector<qcow2::Snapshot>& snapshots);

// One element of qemu-img info's "snapshots" array, keys in qemu's order.
nlohmann::ordered_json SnapshotJson(const qcow2::Snapshot& sn);

}  // namespace thindisk::cli
