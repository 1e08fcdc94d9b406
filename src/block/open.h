// block::Open: a disk image by file name, with format probing and backing
// chains.
//
// Probing follows qemu: when no format is given, a file whose first four
// bytes are the qcow2 magic is qcow2, anything else is raw. Probing is a
// security risk (a guest that writes the qcow2 magic into a raw disk can make
// a later probe treat it as qcow2 and point it at host files as "backing"),
// so callers that know the format should pass it; a given format is always
// used as is.
//
// Backing files are resolved relative to the directory of the image that
// names them (absolute names are used as is), opened read-only with the
// backing format recorded in the header (or probed when there is none), and
// checked for loops (same device and inode twice in one chain) and depth.
//
// Any image name, top or backing, may be an NBD URI (nbd://HOST[:PORT]/NAME,
// nbd+unix:///NAME?socket=PATH, nbds...: nbdclient/nbd_uri.h). As in qemu
// the export is the protocol layer: the format (raw or qcow2) is probed or
// given on top of it. URIs are compared as strings for loops, never joined
// onto an overlay's directory, and always opened with nbdclient::OpenNbd
// (OpenOptions::open_file is for files only).
//
// So may a rados:// name (io/rados_name.h): an image stored as objects in a
// Ceph pool (io/rados_storage.h), again the protocol layer under a probed or
// given format. A relative backing name of an image in RADOS names another
// image in the same pool, and a rados:// backing name that says neither
// conf nor id inherits the overlay's (the cluster a chain lives in is where
// its overlay was found; a conf path stored in an image would tie it to one
// host). Loops are found by the resolved name (conf, id, pool, image).
//
// And an rbd: name (io/rbd_name.h): an existing RBD image, opened as raw
// unless a format is given (an RBD image is a disk, never probed), and a
// fine backing file for a clone: under a rados:// overlay it inherits the
// overlay's conf and id when it names neither.
//
// Thread safety: Open and ProbeFormat are reentrant; the returned Device
// follows the block::Device contract.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "block/device.h"
#include "io/storage.h"
#include "qcow2/snapshot_selector.h"
#include "util/result.h"

namespace thindisk::block {

// Longest backing chain accepted below the top image. A read of a range no
// layer holds walks every layer, and each layer costs an open file and its
// metadata cache; real chains (snapshots, clones of clones) are a handful
// deep, so 16 is generous while still stopping a hostile or runaway chain
// from exhausting file descriptors, memory and stack.
inline constexpr uint32_t kDefaultMaxChainDepth = 16;

struct OpenOptions {
  std::string format;  // "qcow2", "raw", or "" to probe
  bool read_only = false;
  // qemu's image locks (io/qemu_lock.h) on every layer, held while the
  // Device lives: the top image kWrite, or kRead when read-only; backing
  // files kRead. force_share (qemu-img -U) opens read-only layers with
  // kForceShare instead (a read-write open with it is refused); locking =
  // false takes none (the caller holds a lock on the image itself).
  bool locking = true;
  bool force_share = false;
  // With locking: the caller already holds the top image's lock (a
  // QemuImageLock of its own, for a command that opens the image more than
  // once), so this open takes none on it; and/or takes none on the backing
  // files (commit: it holds the layers it reads and writes itself).
  bool caller_locks_top = false;
  bool lock_backing = true;
  io::CacheMode cache = io::CacheMode::kWriteback;
  // A rados:// top image opened for writing: ask a live writer to hand it
  // over (io::OpenOptions::takeover; serve --takeover).
  bool takeover = false;
  // Do not open the backing file of the top image (info, check, rebase -u).
  bool no_backing = false;
  // Open this internal snapshot of the top image instead of its active
  // content (qemu-nbd -l; qcow2 only, else kNotSupported). The view is
  // read-only: set read_only too, so the file is opened and locked for
  // reading. Backing files open as usual.
  qcow2::SnapshotSelector snapshot;
  uint32_t max_chain_depth = kDefaultMaxChainDepth;
  // Metadata cache budget for each qcow2 layer.
  uint64_t cache_bytes = 64ull << 20;
  // Opens each layer's host file; nullptr: io::OpenFile. Lets a caller put
  // another io::Storage under the chain (the bench's latency and counting
  // wrappers, src/bench/bench_image.cc).
  std::function<Result<std::unique_ptr<io::Storage>>(const std::string& path,
                                                     const io::OpenOptions& options)>
      open_file;
};

// True for an image name that is no host path: an NBD URI, a rados:// or
// an rbd: name. Such names are compared as strings, never stat'ed, unlinked or
// joined onto a directory.
bool IsUriName(const std::string& name);

// Opens `filename` (and its backing chain). Errors: kNotFound (missing file),
// kInvalidArgument (unknown format, "backing chain too deep (> N)",
// "backing file loop: a -> b -> a"), whatever the format driver reports
// (kCorrupt, kNotSupported, ...), each naming the file.
Result<std::unique_ptr<Device>> Open(const std::string& filename, const OpenOptions& options);

// "qcow2" or "raw", by the rule above. Errors: the file cannot be read.
Result<std::string> ProbeFormat(const std::string& filename);

// Opens the storage behind an image name: the NBD export for an NBD URI,
// the objects of a rados:// image, the RBD image of an rbd: name, else
// io::OpenFile. A missing name shaped like "scheme://..." is reported
// as an unknown protocol.
Result<std::unique_ptr<io::Storage>> OpenStorage(const std::string& name,
                                                 const io::OpenOptions& options);

// qemu's image lock on `name` for a command that opens the image more than
// once and holds the lock across those opens (io/qemu_lock.h). nullopt for
// an NBD URI (the server guards its export), a rados:// image (its lock is
// the storage's own, taken by every read-write open) and on a filesystem
// without OFD locks; kBusy when another process uses the image.
Result<std::optional<io::QemuImageLock>> LockImage(const std::string& name,
                                                   io::QemuLockMode mode);

// The path a backing name refers to: `backing_name` itself when absolute,
// an NBD URI, named by an NBD overlay or by an overlay with no directory
// part; for an overlay in RADOS, a relative name is the image of that name
// in the same pool and a rados:// name gets the overlay's conf and id when
// it has neither ("rados://p/clone?conf=c" + "base" -> "rados://p/base?conf=c");
// else the overlay's directory joined with it ("dir/overlay.qcow2" +
// "base.qcow2" -> "dir/base.qcow2").
std::string ResolveBackingName(const std::string& overlay, const std::string& backing_name);

}  // namespace thindisk::block
