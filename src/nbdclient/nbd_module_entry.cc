// The entry of thindisk-nbd.so (nbdclient/nbd_module.h): the table of the
// NBD client functions this module holds. Everything else in the module is
// hidden (-fvisibility=hidden and --exclude-libs:
// src/nbdclient/CMakeLists.txt), so its own copies of thindisk's code never
// stand in for the binary's.
#include "nbdclient/nbd_module_abi.h"
#include "nbdclient/nbd_storage.h"
#include "util/module_entry.h"

namespace thindisk::nbdclient::nbd_module {
namespace {

constexpr ModuleTable kTable = {
    .open_nbd = &nbdclient::OpenNbd,
    .read_dirty_map = &nbdclient::ReadDirtyMap,
    .list_exports = &nbdclient::ListExports,
    .open_pipeline = &nbdclient::OpenPipeline,
};

}  // namespace
}  // namespace thindisk::nbdclient::nbd_module

using thindisk::nbdclient::nbd_module::ModuleLayout;
using thindisk::nbdclient::nbd_module::ModuleTable;

extern "C" __attribute__((visibility("default"))) const ModuleTable* thindisk_nbd_module(
    const ModuleLayout& caller, ModuleLayout* own) {
  return thindisk::util::AnswerLoader(caller, own, thindisk::nbdclient::nbd_module::kTable);
}
