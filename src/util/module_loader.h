// util::LoadModule: finding and opening one of thindisk's modules, the
// parts of it built as shared objects and loaded only when a command needs
// them: thindisk-ceph.so (librados and librbd: io/ceph_module.h) and
// thindisk-nbd.so (libnbd, thindisk as an NBD client:
// nbdclient/nbd_module.h). A command that never touches what a module
// holds never maps its libraries, so a cold start does not pay for them,
// and thindisk runs on a host without them: everything else works, and
// what needs a missing module fails saying why.
//
// Where a module is looked for, first found wins:
//  1. $THINDISK_MODULE_DIR/FILE, and nowhere else when the variable is set;
//  2. THINDISK_MODULE_RELDIR relative to the executable's directory (the
//     installed layout: bin/thindisk, lib/thindisk/FILE; dist/CMakeLists.txt);
//  3. the executable's own directory (the build tree's thindisk);
//  4. the build tree's top directory, where this build wrote its modules,
//     for programs inside the build tree only (test programs in its
//     subdirectories): an installed binary never looks into the tree it was
//     built in (a build under /tmp would let anyone plant a module there).
// A module that is found but fails to load (one of its libraries missing,
// a file that is not the module) is an error, not a reason to look further.
//
// A module and the binary must come from one build: they exchange C++
// objects. Each module's entry checks a layout (an ABI number and the
// exchanged types' sizes) that its loader passes; OtherBuildError words
// a refusal.
//
// Thread safety: LoadModule may be called from any thread; callers load
// each module once (a function-local static) and never unload it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/result.h"

namespace thindisk::util {

struct ModuleSpec {
  std::string file;   // "thindisk-ceph.so"
  std::string entry;  // its one exported symbol
  // What it brings, as errors name it: "Ceph" gives "Ceph support is not
  // installed", "not a thindisk Ceph module".
  std::string kind;
  // Fragments of its own libraries' file names ("librados"): a dlopen
  // error naming one of them gets `install` appended.
  std::vector<std::string> libraries;
  std::string install;  // "apt-get install librados2 librbd1"
};

struct LoadedModule {
  std::string path;     // the file that was loaded
  void* entry = nullptr;  // its entry symbol
};

// Finds and loads `spec`'s module, RTLD_LOCAL: its libraries' symbols stay
// its own. kNotSupported saying why when it cannot: none found (naming
// where it was looked for), dlopen's reason, or no entry symbol.
Result<LoadedModule> LoadModule(const ModuleSpec& spec);

// "PATH: the KIND module of another thindisk build (ABI A, table T bytes;
// this one needs ABI A', table T' bytes)".
Status OtherBuildError(const ModuleSpec& spec, const std::string& path, uint32_t their_abi,
                       uint32_t their_table, uint32_t our_abi, uint32_t our_table);

// LoadModule, then the module's table of functions: its entry is a
// `const Table* (const Layout& caller, Layout* own)` that answers nullptr
// (and its own layout) when `caller`, this build's default-made Layout,
// differs from its own. Layout's first two fields are `abi` and `table`.
template <typename Table, typename Layout>
Result<const Table*> LoadModuleTable(const ModuleSpec& spec) {
  TD_ASSIGN_OR_RETURN(LoadedModule loaded, LoadModule(spec));
  using Entry = const Table* (*)(const Layout& caller, Layout* own);
  auto entry = reinterpret_cast<Entry>(loaded.entry);
  const Layout ours;
  Layout theirs;
  const Table* table = entry(ours, &theirs);
  if (!table) {
    return OtherBuildError(spec, loaded.path, theirs.abi, theirs.table, ours.abi, ours.table);
  }
  return table;
}

}  // namespace thindisk::util
