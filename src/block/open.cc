#include "block/open.h"

#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <utility>
#include <vector>

#include "block/read_only_image.h"
#include "io/ceph_module.h"
#include "io/rados_name.h"
#include "io/rbd_name.h"
#include "nbdclient/nbd_module.h"
#include "nbdclient/nbd_uri.h"
#include "qcow2/format.h"
#include "qcow2/image.h"
#include "raw/raw_image.h"
#include "util/endian.h"
#include "vhd/vhd_image.h"
#include "vmdk/vmdk_image.h"

namespace thindisk::block {

namespace {

// One image already opened further up the chain, identified the way the
// host does (a loop may use different names for the same file). An NBD
// export or RADOS image has no inode here: it is identified by its name
// (LayerName).
struct ChainLink {
  dev_t dev = 0;
  ino_t ino = 0;
  std::string name;
  bool uri = false;
};

bool SameLayer(const ChainLink& link, const struct stat& st, const std::string& name, bool uri) {
  if (uri || link.uri) return uri && link.uri && link.name == name;
  return link.dev == st.st_dev && link.ino == st.st_ino;
}

// A name that is neither a file nor an NBD URI: an unknown "scheme://" says
// so rather than "No such file or directory".
Status MissingImage(int error_number, const std::string& filename) {
  if (error_number == ENOENT && !nbdclient::UriScheme(filename).empty()) {
    return Status::NotFound(nbdclient::UnknownProtocolMessage(filename), ENOENT);
  }
  return Status::FromErrno(error_number, filename);
}
using Chain = std::vector<ChainLink>;

// The name a URI layer is known by in the chain: a rados:// name with its
// query in one order (Uri()), so "?id=a&conf=c" and "?conf=c&id=a" meet.
std::string LayerName(const std::string& name) {
  if (io::IsRadosName(name)) {
    auto parsed = io::ParseRadosName(name);
    if (parsed) return parsed->Uri();
  }
  return name;
}

Result<std::string> ProbeStorage(io::Storage& storage) {
  std::array<uint8_t, 4> magic{};
  // A file shorter than 4 bytes reads as zeros past its end: raw.
  TD_RETURN_IF_ERROR(storage.ReadAt(0, magic));
  if (LoadBe32(magic.data()) == qcow2::kMagic) return std::string("qcow2");
  // Import formats, by their magic (see vmdk::Probe and vhd::Probe for the
  // text-descriptor rule and why a fixed vhd probes as raw).
  TD_ASSIGN_OR_RETURN(bool vmdk, vmdk::Probe(storage));
  if (vmdk) return std::string("vmdk");
  TD_ASSIGN_OR_RETURN(bool vpc, vhd::Probe(storage));
  if (vpc) return std::string("vpc");
  return std::string("raw");
}

// The image lock a layer takes (see OpenOptions::locking); depth 0 is the
// top image.
io::QemuLockMode LockFor(const OpenOptions& options, bool read_only, size_t depth) {
  if (!options.locking) return io::QemuLockMode::kNone;
  if (depth == 0 ? options.caller_locks_top : !options.lock_backing) {
    return io::QemuLockMode::kNone;
  }
  if (!read_only) return io::QemuLockMode::kWrite;
  return options.force_share ? io::QemuLockMode::kForceShare : io::QemuLockMode::kRead;
}

std::string LoopMessage(const Chain& chain, const std::string& again) {
  std::string m = "backing file loop: ";
  for (const ChainLink& link : chain) m += link.name + " -> ";
  return m + again;
}

// vmdk and vpc images are read, never written: a write open is refused
// before the driver runs. A vmdk descriptor's extent files are opened
// read-only, relative to the descriptor's directory, and locked as the
// descriptor is (its layer's `depth` in the chain).
Result<std::unique_ptr<Device>> OpenImport(std::unique_ptr<io::Storage> storage,
                                           const std::string& filename, const std::string& format,
                                           bool read_only, size_t depth,
                                           const OpenOptions& options) {
  if (!read_only) {
    return Status::NotSupported(filename + ": " + ReadOnlyFormatMessage(format));
  }
  if (format == "vpc") {
    TD_ASSIGN_OR_RETURN(std::unique_ptr<vhd::VhdImage> image,
                        vhd::VhdImage::Open(std::move(storage), filename));
    return std::unique_ptr<Device>(std::move(image));
  }
  auto open_extent = [&filename, &options,
                      depth](const std::string& name) -> Result<vmdk::OpenedExtent> {
    vmdk::OpenedExtent extent;
    extent.path = ResolveBackingName(filename, name);
    io::OpenOptions io_options;
    io_options.read_only = true;
    io_options.cache = options.cache;
    io_options.lock = LockFor(options, /*read_only=*/true, depth);
    TD_ASSIGN_OR_RETURN(extent.storage, options.open_file
                                            ? options.open_file(extent.path, io_options)
                                            : io::OpenFile(extent.path, io_options));
    return extent;
  };
  TD_ASSIGN_OR_RETURN(std::unique_ptr<vmdk::VmdkImage> image,
                      vmdk::VmdkImage::Open(std::move(storage), filename, open_extent));
  return std::unique_ptr<Device>(std::move(image));
}

Result<std::unique_ptr<Device>> OpenLayer(const std::string& filename, std::string format,
                                          const OpenOptions& options, bool read_only,
                                          bool no_backing, Chain chain) {
  // 1. Identify the file and refuse loops and over-deep chains before
  //    opening anything.
  struct stat st {};
  const bool uri = IsUriName(filename);
  if (!uri && ::stat(filename.c_str(), &st) != 0) return MissingImage(errno, filename);
  const std::string layer_name = uri ? LayerName(filename) : filename;
  for (const ChainLink& link : chain) {
    if (SameLayer(link, st, layer_name, uri)) {
      return Status::InvalidArgument(LoopMessage(chain, filename));
    }
  }
  // chain.size() is this layer's depth: 0 for the top image.
  if (chain.size() > options.max_chain_depth) {
    return Status::InvalidArgument("backing chain too deep (> " +
                                   std::to_string(options.max_chain_depth) + ")");
  }
  chain.push_back({st.st_dev, st.st_ino, layer_name, uri});

  // 2. Open the host file and settle the format.
  io::OpenOptions io_options;
  io_options.read_only = read_only;
  io_options.cache = options.cache;
  io_options.lock = LockFor(options, read_only, chain.size() - 1);
  io_options.takeover = options.takeover && chain.size() == 1;
  TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage,
                      uri                 ? OpenStorage(filename, io_options)
                      : options.open_file ? options.open_file(filename, io_options)
                                          : io::OpenFile(filename, io_options));
  // An RBD image is a disk, not a file that holds one: raw unless the
  // caller (or an overlay's backing format) says otherwise.
  if (format.empty() && io::IsRbdName(filename)) format = "raw";
  if (format.empty()) {
    TD_ASSIGN_OR_RETURN(format, ProbeStorage(*storage));
  }

  // 3. Hand it to the driver. Only the top image shows a snapshot.
  const bool top = chain.size() == 1;
  if (top && !options.snapshot.empty() && format != "qcow2") {
    return Status::NotSupported(filename + ": internal snapshots need a qcow2 image, not " +
                                format);
  }
  if (format == "raw") return raw::OpenRaw(std::move(storage), read_only, filename);
  if (format == "vmdk" || format == "vpc") {
    return OpenImport(std::move(storage), filename, format, read_only, chain.size() - 1, options);
  }
  if (format != "qcow2") {
    return Status::NotSupported(filename + ": unknown or unsupported format '" + format + "'");
  }
  qcow2::OpenOptions q;
  q.read_only = read_only;
  q.cache_bytes = options.cache_bytes;
  q.no_backing = no_backing;
  if (top) q.snapshot = options.snapshot;
  q.open_backing = [filename, options, chain](const std::string& name,
                                              const std::string& backing_format)
      -> Result<std::unique_ptr<Device>> {
    // Backing files are only ever read through an overlay.
    return OpenLayer(ResolveBackingName(filename, name), backing_format, options,
                     /*read_only=*/true, /*no_backing=*/false, chain);
  };
  TD_ASSIGN_OR_RETURN(std::unique_ptr<qcow2::Image> image,
                      qcow2::Image::Open(std::move(storage), q));
  return std::unique_ptr<Device>(std::move(image));
}

// ResolveBackingName for an overlay in RADOS, `at` (see the header): the
// same pool and cluster unless the backing name says otherwise.
std::string ResolveFromRados(io::RadosName at, const std::string& backing) {
  if (io::IsRbdName(backing)) {  // an RBD golden image under a RADOS clone
    auto named = io::ParseRbdName(backing);
    if (!named || !named->conf.empty() || !named->id.empty()) return backing;
    auto escaped = [](const std::string& v) {
      std::string e;
      for (char c : v) {
        if (c == ':' || c == '\\') e += '\\';
        e += c;
      }
      return e;
    };
    std::string resolved = backing;
    if (!at.conf.empty()) resolved += ":conf=" + escaped(at.conf);
    if (!at.id.empty()) resolved += ":id=" + escaped(at.id);
    return resolved;
  }
  if (io::IsRadosName(backing)) {
    auto named = io::ParseRadosName(backing);
    if (!named || !named->conf.empty() || !named->id.empty()) return backing;
    named->conf = at.conf;
    named->id = at.id;
    return named->Uri();
  }
  if (IsUriName(backing)) return backing;  // an NBD export
  at.image = backing;  // a relative name: an image in the same pool
  return at.Uri();
}

}  // namespace

bool IsUriName(const std::string& name) {
  return nbdclient::IsNbdUri(name) || io::IsRadosName(name) || io::IsRbdName(name);
}

std::string ResolveBackingName(const std::string& overlay, const std::string& backing_name) {
  if (backing_name.empty() || backing_name.front() == '/') return backing_name;
  if (io::IsRadosName(overlay)) {
    auto at = io::ParseRadosName(overlay);
    // A name that does not parse is left as it is, for the open to report.
    return at ? ResolveFromRados(std::move(*at), backing_name) : backing_name;
  }
  // A URI is never joined onto a directory, and an export has none.
  if (IsUriName(backing_name) || nbdclient::IsNbdUri(overlay) || io::IsRbdName(overlay)) {
    return backing_name;
  }
  size_t slash = overlay.rfind('/');
  if (slash == std::string::npos) return backing_name;
  return overlay.substr(0, slash + 1) + backing_name;
}

Result<std::unique_ptr<Device>> Open(const std::string& filename, const OpenOptions& options) {
  if (options.force_share && !options.read_only) {
    return Status::InvalidArgument(filename +
                                   ": --force-share (-U) can only be used with read-only opens");
  }
  return OpenLayer(filename, options.format, options, options.read_only, options.no_backing,
                   Chain{});
}

Result<std::string> ProbeFormat(const std::string& filename) {
  io::OpenOptions io_options;
  io_options.read_only = true;
  TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage, OpenStorage(filename, io_options));
  if (io::IsRbdName(filename)) return std::string("raw");  // never probed: see OpenLayer
  return ProbeStorage(*storage);
}

Result<std::unique_ptr<io::Storage>> OpenStorage(const std::string& name,
                                                 const io::OpenOptions& options) {
  if (nbdclient::IsNbdUri(name)) return nbdclient::nbd_module::OpenNbd(name, options.read_only);
  if (io::IsRadosName(name)) return io::ceph_module::OpenRados(name, options);
  if (io::IsRbdName(name)) return io::ceph_module::OpenRbd(name, options);
  auto file = io::OpenFile(name, options);
  if (!file.has_value() && file.error().error_number() == ENOENT) {
    return MissingImage(ENOENT, name);
  }
  return file;
}

Result<std::optional<io::QemuImageLock>> LockImage(const std::string& name,
                                                   io::QemuLockMode mode) {
  if (IsUriName(name)) return std::optional<io::QemuImageLock>();
  auto lock = io::QemuImageLock::Acquire(name, mode);
  if (lock) return std::optional<io::QemuImageLock>(std::move(*lock));
  if (lock.error().code() == Code::kNotSupported) return std::optional<io::QemuImageLock>();
  if (lock.error().error_number() == ENOENT) return MissingImage(ENOENT, name);
  return lock.error();
}

}  // namespace thindisk::block
