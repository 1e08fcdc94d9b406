// SnapshotSelector: which internal snapshot to open, named the ways qemu
// names one (qemu-nbd -l, qemu-img convert -l, and the snapshot.id= /
// snapshot.name= block options).
//
//  - id_or_name: qemu's bare "-l NAME": the snapshot whose id is NAME, else
//    the one whose name is NAME;
//  - otherwise id and/or name: the snapshot that has every one given
//    (both given: the same snapshot must carry both).
//
// Header-only and dependency-free so block/open.h can carry one through to
// the qcow2 driver.
#pragma once

#include <string>

namespace thindisk::qcow2 {

struct SnapshotSelector {
  std::string id_or_name;
  std::string id;
  std::string name;

  bool empty() const { return id_or_name.empty() && id.empty() && name.empty(); }
  // How the selector reads in messages: "'snap1'", "id '2'", "id '2' name 'x'".
  std::string Describe() const {
    if (!id_or_name.empty()) return "'" + id_or_name + "'";
    std::string s;
    if (!id.empty()) s = "id '" + id + "'";
    if (!name.empty()) s += (s.empty() ? "" : " ") + std::string("name '") + name + "'";
    return s;
  }
};

}  // namespace thindisk::qcow2
