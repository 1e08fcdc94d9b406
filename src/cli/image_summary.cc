#include "cli/image_summary.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <utility>

#include "block/open.h"
#include "cli/image_create.h"
#include "nbdclient/nbd_uri.h"
#include "qcow2/bitmaps.h"
#include "vhd/vhd_image.h"

namespace thindisk::cli {

namespace {

// The header, its extensions and the backing name all lie in the first
// cluster, and clusters are at most 2^kMaxClusterBits bytes.
constexpr uint64_t kHeaderReadLimit = 1ull << qcow2::kMaxClusterBits;
// The snapshot table is read whole; qemu refuses tables above 64 MiB, so a
// larger read could only serve a hostile header.
constexpr uint64_t kSnapshotTableReadLimit = 64ull << 20;

Result<std::vector<qcow2::Snapshot>> ReadSnapshots(io::Storage& storage, const qcow2::Header& h) {
  if (h.nb_snapshots == 0) return std::vector<qcow2::Snapshot>{};
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage.Size());
  if (h.snapshots_offset >= file_size) {
    return Status::Corrupt("snapshot table offset is past the end of the file");
  }
  std::vector<uint8_t> bytes(std::min(file_size - h.snapshots_offset, kSnapshotTableReadLimit));
  TD_RETURN_IF_ERROR(storage.ReadAt(h.snapshots_offset, bytes));
  return qcow2::DecodeSnapshotTable(bytes, h.nb_snapshots, h.cluster_bits);
}

// vmdk and vpc have no header decoder of their own here: their drivers
// read them (read-only, as always).
Result<ImageSummary> ReadImportSummary(ImageSummary s, bool force_share) {
  block::OpenOptions options;
  options.format = s.format;
  options.read_only = true;
  options.force_share = force_share;
  TD_ASSIGN_OR_RETURN(std::unique_ptr<block::Device> dev, block::Open(s.filename, options));
  s.virtual_size = dev->size();
  s.cluster_size = dev->info().cluster_size;
  if (auto* image = dynamic_cast<vmdk::VmdkImage*>(dev.get())) {
    s.vmdk = image->description();
    TD_ASSIGN_OR_RETURN(s.actual_size, image->AllocatedBytes());  // descriptor + extent
  } else if (auto* vpc = dynamic_cast<vhd::VhdImage*>(dev.get())) {
    TD_ASSIGN_OR_RETURN(s.actual_size, vpc->storage().AllocatedBytes());
  }
  return s;
}

}  // namespace

Result<qcow2::Header> ReadQcow2Header(io::Storage& storage) {
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage.Size());
  std::vector<uint8_t> bytes(std::min(file_size, kHeaderReadLimit));
  TD_RETURN_IF_ERROR(storage.ReadAt(0, bytes));
  return qcow2::DecodeHeader(bytes, file_size);
}

Result<ImageSummary> ReadImageSummary(const std::string& filename, const std::string& format,
                                      bool force_share) {
  ImageSummary s;
  s.filename = filename;
  s.format = format;
  if (s.format.empty()) {
    TD_ASSIGN_OR_RETURN(s.format, block::ProbeFormat(filename));
  }
  if (s.format == "vmdk" || s.format == "vpc") {
    return ReadImportSummary(std::move(s), force_share);
  }
  if (s.format != "raw" && s.format != "qcow2") {
    return Status::NotSupported(filename + ": unknown or unsupported format '" + s.format + "'");
  }
  io::OpenOptions io_options;
  io_options.read_only = true;
  // A reader, as qemu-img info is: refused beside a writer unless -U.
  io_options.lock = force_share ? io::QemuLockMode::kForceShare : io::QemuLockMode::kRead;
  TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage,
                      block::OpenStorage(filename, io_options));
  TD_ASSIGN_OR_RETURN(s.actual_size, storage->AllocatedBytes());
  if (s.format == "raw") {
    TD_ASSIGN_OR_RETURN(s.virtual_size, storage->Size());
    return s;
  }
  auto header = ReadQcow2Header(*storage);
  if (!header.has_value()) return header.error().WithContext(filename);
  s.virtual_size = header->size;
  auto snapshots = ReadSnapshots(*storage, *header);
  if (!snapshots.has_value()) return snapshots.error().WithContext(filename);
  s.snapshots = std::move(snapshots).value();
  auto bitmaps = qcow2::ReadBitmapDirectory(*storage, *header);
  if (bitmaps) {
    s.bitmaps = std::move(bitmaps).value();
  } else {
    s.bitmaps_problem = bitmaps.error().message();
  }
  for (const qcow2::RawExtension& e : header->unknown_extensions) {
    if (e.type == qcow2::kExtBitmaps) {
      s.bitmaps_problem =
          "a program without bitmap support wrote the image: its bitmaps are inconsistent";
    }
  }
  if (!header->backing_file.empty()) {
    s.backing_filename = header->backing_file;
    s.full_backing_filename = block::ResolveBackingName(filename, header->backing_file);
  }
  s.header = std::move(header).value();
  return s;
}

Result<std::vector<ImageSummary>> ReadBackingChain(const std::string& filename,
                                                   const std::string& format, bool force_share) {
  std::vector<ImageSummary> chain;
  std::set<std::pair<dev_t, ino_t>> seen;
  std::set<std::string> seen_uris;
  std::string name = filename;
  std::string fmt = format;
  std::string path_text;
  while (true) {
    struct stat st {};
    const bool uri = block::IsUriName(name);
    if (!uri && ::stat(name.c_str(), &st) != 0) return Status::FromErrno(errno, name);
    path_text += (path_text.empty() ? "" : " -> ") + name;
    // An NBD export or RADOS image is identified by its name (seen_uris), a
    // file by inode.
    if (uri ? !seen_uris.insert(name).second : !seen.insert({st.st_dev, st.st_ino}).second) {
      return Status::InvalidArgument("backing file loop: " + path_text);
    }
    if (chain.size() > block::kDefaultMaxChainDepth) {
      return Status::InvalidArgument("backing chain too deep (> " +
                                     std::to_string(block::kDefaultMaxChainDepth) + ")");
    }
    TD_ASSIGN_OR_RETURN(ImageSummary s, ReadImageSummary(name, fmt, force_share));
    std::string next = s.full_backing_filename;
    std::string next_format = s.header ? s.header->backing_format : "";
    chain.push_back(std::move(s));
    if (next.empty()) return chain;
    name = next;
    fmt = next_format;
  }
}

std::vector<std::string> BackingNamesBelow(const std::string& filename,
                                           const std::string& format) {
  std::vector<std::string> names;
  std::set<std::pair<dev_t, ino_t>> seen;
  std::set<std::string> seen_uris;
  std::string name = filename;
  std::string fmt = format;
  for (size_t depth = 0; depth <= block::kDefaultMaxChainDepth; ++depth) {
    struct stat st {};
    const bool uri = block::IsUriName(name);
    if (!uri && ::stat(name.c_str(), &st) != 0) break;
    if (uri ? !seen_uris.insert(name).second
            : !seen.insert({st.st_dev, st.st_ino}).second)
      break;  // a loop: named once
    if (depth > 0) names.push_back(name);
    if (nbdclient::IsNbdUri(name)) break;
    auto s = ReadImageSummary(name, fmt, /*force_share=*/true);
    if (!s.has_value() || s->full_backing_filename.empty()) break;
    name = s->full_backing_filename;
    fmt = s->header ? s->header->backing_format : "";
  }
  return names;
}

std::optional<std::string> ChainHolding(const std::string& top,
                                        const std::vector<std::string>& below,
                                        const std::string& target) {
  std::string chain = top;
  bool holds = false;
  for (const std::string& name : below) {
    chain += " -> " + name;
    holds = holds || SameImage(name, target) != nullptr;
  }
  if (!holds) return std::nullopt;
  return chain;
}

Status RefuseBackingLoop(const std::string& image, const std::string& backing,
                         const std::string& path, const std::string& format) {
  if (SameImage(path, image) != nullptr) {
    return Status::InvalidArgument(image + ": the backing file (" + backing +
                                   ") is the image itself");
  }
  if (format.empty()) return Status::Ok();
  if (auto chain = ChainHolding(path, BackingNamesBelow(path, format), image)) {
    return Status::InvalidArgument(image + " would be in its own backing chain (" +
                                   image + " -> " + *chain + "): a backing file loop");
  }
  return Status::Ok();
}

Status RefuseTargetUnderSource(const std::string& source, const std::string& format,
                               const std::string& target) {
  if (auto chain = ChainHolding(source, BackingNamesBelow(source, format), target)) {
    return Status::InvalidArgument(target + " is a backing file of " + source + " (" +
                                   *chain +
                                   "): writing it would change what the copy reads");
  }
  return Status::Ok();
}

}  // namespace thindisk::cli
