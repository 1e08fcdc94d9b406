// The entry of thindisk-tls.so (nbd/tls.h): the table of the TLS functions
// this module holds. Everything else in the module is hidden
// (thindisk_add_module: src/util/CMakeLists.txt), so its own copies of
// thindisk's code never stand in for the binary's.
#include "nbd/tls_gnutls.h"
#include "nbd/tls_module_abi.h"
#include "util/module_entry.h"

namespace thindisk::nbd::tls_module {
namespace {

constexpr ModuleTable kTable = {
    .create_server = &CreateGnutlsServer,
};

}  // namespace
}  // namespace thindisk::nbd::tls_module

using thindisk::nbd::tls_module::ModuleLayout;
using thindisk::nbd::tls_module::ModuleTable;

extern "C" __attribute__((visibility("default"))) const ModuleTable* thindisk_tls_module(
    const ModuleLayout& caller, ModuleLayout* own) {
  return thindisk::util::AnswerLoader(caller, own, thindisk::nbd::tls_module::kTable);
}
