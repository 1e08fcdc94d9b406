// The entry of thindisk-ceph.so (io/ceph_module.h): the table of the Ceph
// functions this module holds. Everything else in the module is hidden
// (-fvisibility=hidden and --exclude-libs: src/io/CMakeLists.txt), so its
// own copies of thindisk's code never stand in for the binary's.
#include <memory>
#include <string>

#include "io/ceph_module_abi.h"
#include "io/rados_cluster.h"
#include "io/rados_lock.h"
#include "io/rados_name.h"
#include "io/rados_storage.h"
#include "io/rbd_storage.h"
#include "util/module_entry.h"

namespace thindisk::io::ceph_module {
namespace {

Result<std::shared_ptr<void>> HoldClusterImpl(const std::string& pool) {
  TD_ASSIGN_OR_RETURN(RadosName name, ParseRadosPool(pool));
  TD_ASSIGN_OR_RETURN(std::shared_ptr<RadosCluster> cluster, RadosCluster::Get(name));
  return std::shared_ptr<void>(std::move(cluster));
}

constexpr ModuleTable kTable = {
    .open_rados = &io::OpenRados,
    .open_rbd = &io::OpenRbd,
    .create_rados_formatted = &io::CreateRadosFormatted,
    .remove_rados = &io::RemoveRados,
    .list_rados = &io::ListRados,
    .list_rados_lockers = &io::ListRadosLockers,
    .break_rados_lock = &io::BreakRadosLock,
    .hold_cluster = &HoldClusterImpl,
    .set_rados_release_handler = &io::SetRadosReleaseHandler,
};

}  // namespace
}  // namespace thindisk::io::ceph_module

using thindisk::io::ceph_module::ModuleLayout;
using thindisk::io::ceph_module::ModuleTable;

extern "C" __attribute__((visibility("default"))) const ModuleTable* thindisk_ceph_module(
    const ModuleLayout& caller, ModuleLayout* own) {
  return thindisk::util::AnswerLoader(caller, own, thindisk::io::ceph_module::kTable);
}
