// io::ceph: how the rest of thindisk reaches Ceph: images stored as RADOS
// objects (rados://POOL/IMAGE, io/rados_storage.h) and existing RBD images
// (rbd:POOL/IMAGE, io/rbd_storage.h).
//
// The code behind these functions lives in a module, thindisk-ceph.so,
// loaded the first time one of them needs it. librados and librbd bring
// libceph-common (20 MB, two dozen more libraries): mapping them costs a
// cold start 60-80 ms, most of thindisk's start-up, which every command
// would pay for images that never touch Ceph. Loaded on demand, only a
// process that opens a Ceph name pays it, and thindisk runs on a host
// without the Ceph libraries: every other image works, a Ceph name fails
// with the reason (qemu loads its rbd driver the same way).
//
// Where the module is looked for, and what a module that is found but does
// not load means: util/module_loader.h.
//
// The module and the binary must come from one build: they exchange C++
// objects (Status, Storage, std::function). The module's entry checks an
// ABI number and the exchanged types' sizes, so a stray module is refused
// with a message rather than trusted.
//
// Thread safety: every function may be called from any thread; the module
// is loaded once (the first caller waits) and never unloaded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/storage.h"
#include "util/result.h"

namespace thindisk::io {

// One image found in a pool by ceph::ListRados.
struct RadosImageEntry {
  std::string name;  // the image's name in the pool (rados://POOL/name)
  // The stored image file's byte size as its header says (durable at the
  // last flush): a qcow2 image's file size, not its virtual size.
  uint64_t size = 0;
  uint64_t object_size = 0;
};

// One holder of an image's lock (io/rados_lock.h).
struct RadosLocker {
  std::string client;     // "client.4123"
  std::string cookie;     // the holder's open: "pid 77 on host vm1 (<16 hex>)"
  std::string address;    // "127.0.0.1:0/2718281828" (what is blocklisted)
  bool watching = false;  // its client has a watch on the header: alive

  // "client.4123 at ADDRESS (COOKIE)".
  std::string ToString() const { return client + " at " + address + " (" + cookie + ")"; }
};

// What a process does when another asks for one of its images
// (`uri`, "rados://POOL/IMAGE"): true when it will release it soon (it must
// not block: it runs on a librados thread), false to refuse. One handler
// per process; nullptr (the default) refuses every request.
using RadosReleaseHandler = std::function<bool(const std::string& uri)>;

// How far a removal has come: `done` of `total` objects removed (the
// header counted last). Called on the removing thread.
using RemoveProgress = std::function<void(uint64_t done, uint64_t total)>;

}  // namespace thindisk::io

namespace thindisk::io::ceph_module {

// The module's file name.
inline constexpr const char* kModuleFile = "thindisk-ceph.so";

// Loads the module if it is not loaded yet. kNotSupported saying why when
// it cannot be: none found (naming where it was looked for), or dlopen's
// reason (a Ceph library missing: which package to install).
Status Load();

// Each forwards to the function of the same name in io/rados_storage.h,
// io/rbd_storage.h or io/rados_lock.h, after Load(); its error when that
// fails, with the image's name as context.
Result<std::unique_ptr<Storage>> OpenRados(const std::string& name,
                                           const OpenOptions& options);
Result<std::unique_ptr<Storage>> OpenRbd(const std::string& name,
                                         const OpenOptions& options);
Status CreateRadosFormatted(const std::string& name, uint64_t object_size,
                            const std::function<Status(Storage&)>& format);
Status RemoveRados(const std::string& name, const RemoveProgress& progress = nullptr);
Result<std::vector<RadosImageEntry>> ListRados(const std::string& pool);
Result<std::vector<RadosLocker>> ListRadosLockers(const std::string& name);
Result<std::vector<RadosLocker>> BreakRadosLock(const std::string& name, bool force);

// Keeps the connection to `pool`'s cluster (rados://POOL[?conf=..&id=..])
// open while the returned handle lives, so the opens and listings in
// between share it (io/rados_cluster.h) instead of connecting each time.
Result<std::shared_ptr<void>> HoldCluster(const std::string& pool);

// Installs the process's release handler (io/rados_lock.h). It does not
// load the module: a process that never opens a Ceph image has nothing to
// hand over, and one that loads it later gets the handler then.
void SetRadosReleaseHandler(RadosReleaseHandler handler);

}  // namespace thindisk::io::ceph_module
