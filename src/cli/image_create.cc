#include "cli/image_create.h"

#include <sys/stat.h>
#include <unistd.h>

#include "block/open.h"
#include "cli/common.h"
#include "io/ceph_module.h"
#include "io/rados_header.h"
#include "io/rados_name.h"
#include "io/rbd_name.h"
#include "nbdclient/export_file.h"
#include "nbdclient/nbd_uri.h"
#include "qcow2/format.h"
#include "qcow2/measure.h"

namespace thindisk::cli {
namespace {

// The qcow2 image a plan makes. Its size is rounded up to whole 512-byte
// sectors, as qemu-img create and convert round it (a qcow2 virtual size
// is a sector count): a 1001-byte request, or the copy of a 1001-byte raw
// source, makes a 1024-byte image whose tail reads as zeros.
qcow2::CreateOptions Qcow2Options(const CreatePlan& plan) {
  qcow2::CreateOptions q = plan.qcow2;
  q.size = plan.size > UINT64_MAX - 511 ? plan.size : (plan.size + 511) / 512 * 512;
  q.backing_file = plan.backing_file;
  q.backing_format = plan.backing_format;
  return q;
}

Status WriteImage(io::Storage& storage, const CreatePlan& plan, std::string* warning) {
  if (plan.format == "raw")
    return raw::CreateRaw(storage, plan.size, plan.raw_prealloc, warning);
  return qcow2::Create(storage, Qcow2Options(plan), warning);
}

Result<raw::RawPrealloc> ParseRawPrealloc(const std::string& v) {
  if (v == "off") return raw::RawPrealloc::kOff;
  if (v == "falloc") return raw::RawPrealloc::kFalloc;
  if (v == "full") return raw::RawPrealloc::kFull;
  return Status::InvalidArgument("invalid preallocation mode '" + v +
                                 "' for raw (off, falloc or full)");
}

// A new image in a pool: the header object first (exclusive, so an image
// that exists is refused and left alone), then the format written through
// the storage; any failure after the header removes the image again.
Status CreateRadosImage(const std::string& name, const CreatePlan& plan) {
  const uint64_t object_size =
      plan.object_size ? plan.object_size : uint64_t(1) << io::RadosHeader::kDefaultObjectOrder;
  if (plan.format == "qcow2" && object_size % plan.qcow2.cluster_size != 0) {
    return Status::InvalidArgument(name + ": object_size " + std::to_string(object_size) +
                                   " is not a multiple of the cluster size " +
                                   std::to_string(plan.qcow2.cluster_size));
  }
  std::string warning;
  Status made = io::ceph_module::CreateRadosFormatted(
      name, object_size, [&](io::Storage& storage) { return WriteImage(storage, plan, &warning); });
  if (made.code() == Code::kBusy) {
    return Status(Code::kBusy, made.message() + " (remove it first: thindisk rm " + name + ")",
                  EEXIST);
  }
  TD_RETURN_IF_ERROR(made);
  if (!warning.empty()) PrintWarning(warning);
  return Status::Ok();
}

// Lays an empty image on a store of fixed size (an NBD export, or a block
// device: `what` says which): see CreateOnExport in image_create.h.
Status CreateInPlace(const std::string& name, const char* what, const CreatePlan& plan,
                     block::Device* src, const io::OpenOptions& io_options) {
  TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> store,
                      block::OpenStorage(name, io_options));
  TD_ASSIGN_OR_RETURN(uint64_t capacity, store->Size());
  auto too_small = [&](uint64_t needed) {
    return Status(Code::kNoSpace,
                  name + ": the " + what + " is too small (" + std::to_string(capacity) +
                      " bytes) for the " + plan.format + " image (" +
                      std::to_string(needed) + " bytes needed)",
                  ENOSPC);
  };
  if (plan.format == "raw") {
    if (capacity < plan.size) return too_small(plan.size);
    TD_RETURN_IF_ERROR(store->PunchHole(0, plan.size));
    return store->Flush();
  }
  const qcow2::CreateOptions q = Qcow2Options(plan);
  TD_ASSIGN_OR_RETURN(uint64_t full, qcow2::FullyAllocatedSize(q));
  if (capacity < full) {
    TD_ASSIGN_OR_RETURN(qcow2::MeasureResult m, qcow2::Measure(src, q));
    if (capacity < m.required) return too_small(m.required);
  }
  TD_ASSIGN_OR_RETURN(std::unique_ptr<nbdclient::ExportFile> view,
                      nbdclient::ExportFile::Make(*store));
  std::string warning;
  Status s = qcow2::Create(*view, q, &warning);
  if (!s.ok()) return s.WithContext(name);
  if (!warning.empty()) PrintWarning(warning);
  return Status::Ok();
}

}  // namespace

Result<qcow2::Preallocation> ParseQcow2Prealloc(const std::string& v) {
  if (v == "off") return qcow2::Preallocation::kOff;
  if (v == "metadata") return qcow2::Preallocation::kMetadata;
  if (v == "falloc") return qcow2::Preallocation::kFalloc;
  if (v == "full") return qcow2::Preallocation::kFull;
  return Status::InvalidArgument("invalid preallocation mode '" + v +
                                 "' (off, metadata, falloc or full)");
}

Status ApplyCreateOption(CreatePlan& plan, const std::string& key, const std::string& value) {
  if (key == "size") {
    TD_ASSIGN_OR_RETURN(plan.size, ParseSize(value));
    plan.have_size = true;
  } else if (key == "backing_file") {
    plan.backing_file = value;
  } else if (key == "backing_fmt") {
    plan.backing_format = value;
  } else if (key == "object_size") {
    TD_ASSIGN_OR_RETURN(plan.object_size, ParseSize(value));
    // The range and power-of-two rule are io::RadosObjectOrder's.
    TD_RETURN_IF_ERROR(io::RadosObjectOrder(plan.object_size, "object_size").status());
  } else if (key == "preallocation") {
    if (plan.format == "raw") {
      TD_ASSIGN_OR_RETURN(plan.raw_prealloc, ParseRawPrealloc(value));
    } else {
      TD_ASSIGN_OR_RETURN(plan.qcow2.preallocation, ParseQcow2Prealloc(value));
    }
    plan.preallocation_text = value;
  } else if (plan.format == "raw") {
    return Status::InvalidArgument("invalid parameter '" + key + "' for format raw");
  } else if (key == "cluster_size") {
    TD_ASSIGN_OR_RETURN(uint64_t cs, ParseSize(value));
    if (cs > (1u << qcow2::kMaxClusterBits)) {
      return Status::InvalidArgument("cluster size must be a power of two between 512 and 2048k");
    }
    plan.qcow2.cluster_size = static_cast<uint32_t>(cs);
  } else if (key == "extended_l2") {
    TD_ASSIGN_OR_RETURN(plan.qcow2.extended_l2, ParseOnOff(key, value));
    plan.extended_l2_given = true;
  } else if (key == "lazy_refcounts") {
    TD_ASSIGN_OR_RETURN(plan.qcow2.lazy_refcounts, ParseOnOff(key, value));
  } else if (key == "compression_type") {
    if (value == "zlib") {
      plan.qcow2.compression_type = qcow2::CompressionType::kZlib;
    } else if (value == "zstd") {
      plan.qcow2.compression_type = qcow2::CompressionType::kZstd;
    } else {
      return Status::InvalidArgument("invalid compression_type '" + value + "' (zlib or zstd)");
    }
    plan.compression_type_given = true;
  } else if (key == "refcount_bits") {
    TD_ASSIGN_OR_RETURN(uint64_t bits, ParseSize(value));
    if (bits > 64) return Status::InvalidArgument("refcount_bits must be a power of two <= 64");
    plan.qcow2.refcount_bits = static_cast<uint32_t>(bits);
  } else if (key == "compat") {
    if (value == "0.10" || value == "v2") {
      plan.qcow2.version = 2;
    } else if (value == "1.1" || value == "v3") {
      plan.qcow2.version = 3;
    } else {
      return Status::InvalidArgument("invalid compat level '" + value + "' (0.10, 1.1, v2, v3)");
    }
    plan.compat_text = value;
  } else {
    return Status::InvalidArgument("invalid parameter '" + key + "' for format qcow2");
  }
  return Status::Ok();
}

std::string FormattingLine(const std::string& filename, const CreatePlan& p) {
  std::string line = "Formatting '" + filename + "', fmt=" + p.format;
  if (p.format == "raw") {
    line += " size=" + std::to_string(p.size);
    if (!p.preallocation_text.empty()) line += " preallocation=" + p.preallocation_text;
    return line;
  }
  const qcow2::CreateOptions& q = p.qcow2;
  line += " cluster_size=" + std::to_string(q.cluster_size);
  line += std::string(" extended_l2=") + (q.extended_l2 ? "on" : "off");
  if (!p.preallocation_text.empty()) line += " preallocation=" + p.preallocation_text;
  line += std::string(" compression_type=") +
          (q.compression_type == qcow2::CompressionType::kZstd ? "zstd" : "zlib");
  line += " size=" + std::to_string(p.size);
  if (!p.backing_file.empty()) line += " backing_file=" + p.backing_file;
  if (!p.backing_format.empty()) line += " backing_fmt=" + p.backing_format;
  if (!p.compat_text.empty()) line += " compat=" + p.compat_text;
  if (p.object_size) line += " object_size=" + std::to_string(p.object_size);
  line += std::string(" lazy_refcounts=") + (q.lazy_refcounts ? "on" : "off");
  line += " refcount_bits=" + std::to_string(q.refcount_bits);
  return line;
}

Status ApplyCreateOptions(CreatePlan& plan, const std::vector<std::string>& option_strings) {
  for (const std::string& text : option_strings) {
    TD_ASSIGN_OR_RETURN(OptionMap options, ParseOptionString(text));
    for (const auto& [key, value] : options) TD_RETURN_IF_ERROR(ApplyCreateOption(plan, key, value));
  }
  if (plan.format == "qcow2" && plan.qcow2.version < 3) {
    if (!plan.extended_l2_given) plan.qcow2.extended_l2 = false;
    if (!plan.compression_type_given) plan.qcow2.compression_type = qcow2::CompressionType::kZlib;
  }
  DefaultExtendedL2(plan);
  return Status::Ok();
}

void DefaultExtendedL2(CreatePlan& plan) {
  if (plan.format == "qcow2" && !plan.extended_l2_given &&
      plan.qcow2.cluster_size < qcow2::kMinExtendedL2ClusterSize)
    plan.qcow2.extended_l2 = false;
}

Status CreateImageFile(const std::string& filename, const CreatePlan& plan,
                       block::Device* src) {
  if (plan.object_size && !io::IsRadosName(filename)) {
    return Status::InvalidArgument(filename +
                                   ": object_size is an option of rados:// images only");
  }
  if (io::IsRadosName(filename)) return CreateRadosImage(filename, plan);
  if (io::IsRbdName(filename)) {
    return Status::NotSupported(filename +
                                ": thindisk does not create RBD images (use rbd create, or a "
                                "rados:// image)");
  }
  if (nbdclient::IsNbdUri(filename)) return CreateOnExport(filename, plan, src);
  io::OpenOptions io_options;
  // Before the truncation below: an image another process uses is refused
  // and left as it is (qemu-img create locks first, too).
  io_options.lock = io::QemuLockMode::kWrite;
  struct stat st {};
  if (::stat(filename.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    // A block device (or a link to one, as /dev/VG/LV is) keeps its size
    // and its node: the image is laid on it as on an export, as qemu-img
    // lays one on a host_device.
    if (S_ISBLK(st.st_mode))
      return CreateInPlace(filename, "device", plan, src, io_options);
    return Status::InvalidArgument(
        filename + " is " + NodeKind(st.st_mode) +
        ": an image is made in a file, on a block device, an NBD "
        "export or a rados:// pool");
  }
  io_options.create = true;
  TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage, io::OpenFile(filename, io_options));
  std::string warning;
  Status s = storage->Resize(0);  // qemu-img create overwrites an existing file
  if (s.ok()) s = WriteImage(*storage, plan, &warning);
  if (s.ok()) s = storage->Flush();
  storage.reset();
  if (!s.ok()) {
    RemoveCreatedImage(filename);
    return s.WithContext(filename);
  }
  if (!warning.empty()) PrintWarning(warning);
  return Status::Ok();
}

const char* SameImage(const std::string& source, const std::string& destination) {
  if (nbdclient::IsNbdUri(source) && source == destination) return "export";
  auto src_rados = io::ParseRadosName(source);
  auto dst_rados = io::ParseRadosName(destination);
  if (src_rados && dst_rados && src_rados->ToString() == dst_rados->ToString()) {
    return "image";
  }
  struct stat a {
  }, b{};
  if (::stat(source.c_str(), &a) == 0 && ::stat(destination.c_str(), &b) == 0 &&
      a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
    return "file";
  }
  return source == destination ? "image" : nullptr;
}

void RemoveCreatedImage(const std::string& filename) {
  struct stat st {};
  if (io::IsRadosName(filename)) {
    (void)io::ceph_module::RemoveRados(filename);
  } else if (!block::IsUriName(filename) && ::stat(filename.c_str(), &st) == 0 &&
             S_ISREG(st.st_mode)) {
    ::unlink(filename.c_str());  // never a device's node
  }
}

// See image_create.h.
Status CreateOnExport(const std::string& uri, const CreatePlan& plan, block::Device* src) {
  return CreateInPlace(uri, "export", plan, src, io::OpenOptions());
}

}  // namespace thindisk::cli
