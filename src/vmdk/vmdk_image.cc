#include "vmdk/vmdk_image.h"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

namespace thindisk::vmdk {

namespace {

// Everything Open learns before the device exists.
struct Layout {
  Description description;
  std::unique_ptr<io::Storage> extent;  // a separate extent file, if any
  std::unique_ptr<SparseExtent> sparse;
  uint64_t size = 0;
  uint64_t flat_offset = 0;
};

Result<Descriptor> ReadDescriptor(io::Storage& storage, uint64_t offset, uint64_t length) {
  std::string text(length, '\0');
  TD_RETURN_IF_ERROR(storage.ReadAt(
      offset, std::span<uint8_t>(reinterpret_cast<uint8_t*>(text.data()), text.size())));
  TD_ASSIGN_OR_RETURN(Descriptor d, ParseDescriptor(text));
  TD_RETURN_IF_ERROR(CheckSupported(d));
  return d;
}

// Opens the sparse extent in `storage`; `expected_sectors` is what the
// descriptor says it holds (0: no descriptor to agree with).
Status OpenSparse(io::Storage& storage, uint64_t expected_sectors, bool have_descriptor,
                  Layout& layout) {
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage.Size());
  std::array<uint8_t, kHeaderSize> head{};
  TD_RETURN_IF_ERROR(storage.ReadAt(0, head));
  TD_ASSIGN_OR_RETURN(SparseHeader h, DecodeSparseHeader(head, file_size));
  if (have_descriptor && h.capacity != expected_sectors) {
    return Status::Corrupt("vmdk descriptor says " + std::to_string(expected_sectors) +
                           " sectors, the sparse header " + std::to_string(h.capacity));
  }
  TD_ASSIGN_OR_RETURN(layout.sparse, SparseExtent::Open(storage, h));
  layout.size = h.capacity_bytes();
  return Status::Ok();
}

void Describe(const Descriptor& d, Layout& layout) {
  layout.description.create_type = d.create_type;
  layout.description.cid = d.cid;
  layout.description.parent_cid = d.parent_cid;
}

// A KDMV file: a monolithic sparse or stream-optimized image, or a bare
// sparse extent without a descriptor.
Status OpenSparseFile(io::Storage& storage, const std::string& filename, Layout& layout) {
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage.Size());
  std::array<uint8_t, kHeaderSize> head{};
  TD_RETURN_IF_ERROR(storage.ReadAt(0, head));
  TD_ASSIGN_OR_RETURN(SparseHeader h, DecodeSparseHeader(head, file_size));
  uint64_t sectors = 0;
  if (h.descriptor_offset != 0) {
    TD_ASSIGN_OR_RETURN(Descriptor d, ReadDescriptor(storage, h.descriptor_offset * kSectorSize,
                                                     h.descriptor_size * kSectorSize));
    if (!IsSparseCreateType(d.create_type)) {
      return Status::Corrupt("vmdk sparse file's descriptor says createType " + d.create_type);
    }
    Describe(d, layout);
    sectors = d.extents.front().sectors;
  } else {
    layout.description.create_type = h.compressed() ? "streamOptimized" : "monolithicSparse";
  }
  TD_RETURN_IF_ERROR(OpenSparse(storage, sectors, h.descriptor_offset != 0, layout));
  layout.description.extents.push_back(
      {filename, layout.size, uint32_t(h.grain_bytes()), "", h.compressed()});
  return Status::Ok();
}

// A text descriptor file naming one extent file.
Status OpenDescriptorFile(io::Storage& storage, uint64_t file_size,
                          const OpenExtentFn& open_extent, Layout& layout) {
  if (file_size > kMaxDescriptorBytes) {
    return Status::Corrupt("vmdk descriptor file is larger than 1 MiB");
  }
  TD_ASSIGN_OR_RETURN(Descriptor d, ReadDescriptor(storage, 0, file_size));
  Describe(d, layout);
  const ExtentLine& line = d.extents.front();
  if (line.sectors > kMaxCapacitySectors || line.offset > kMaxCapacitySectors) {
    return Status::Corrupt("vmdk extent of " + std::to_string(line.sectors) + " sectors at " +
                           std::to_string(line.offset) + " is larger than 64 TiB");
  }
  if (!open_extent) return Status::NotSupported("vmdk extent files cannot be opened here");
  TD_ASSIGN_OR_RETURN(OpenedExtent opened, open_extent(line.filename));
  layout.extent = std::move(opened.storage);
  if (IsSparseCreateType(d.create_type)) {
    Status s = OpenSparse(*layout.extent, line.sectors, /*have_descriptor=*/true, layout);
    if (!s.ok()) return s.WithContext(opened.path);
    const SparseHeader& h = layout.sparse->header();
    layout.description.extents.push_back(
        {opened.path, layout.size, uint32_t(h.grain_bytes()), "", h.compressed()});
    return Status::Ok();
  }
  TD_ASSIGN_OR_RETURN(uint64_t extent_size, layout.extent->Size());
  layout.size = line.sectors * kSectorSize;
  layout.flat_offset = line.offset * kSectorSize;
  if (layout.flat_offset + layout.size > extent_size) {
    return Status::Corrupt(opened.path + ": flat extent file (" + std::to_string(extent_size) +
                           " bytes) is shorter than the extent it holds (" +
                           std::to_string(layout.flat_offset + layout.size) + ")");
  }
  layout.description.extents.push_back({opened.path, layout.size, 0, line.type, false});
  return Status::Ok();
}

Status OpenLayout(io::Storage& storage, const std::string& filename,
                  const OpenExtentFn& open_extent, Layout& layout) {
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage.Size());
  std::array<uint8_t, kHeaderSize> head{};
  TD_RETURN_IF_ERROR(storage.ReadAt(0, head));
  const uint32_t magic = LoadLe32(head.data());
  if (magic == kSparseMagic) return OpenSparseFile(storage, filename, layout);
  if (magic == kCowdMagic) {
    return Status::NotSupported("ESX/GSX (COWD) sparse vmdk extents are not supported");
  }
  if (LooksLikeDescriptor(head)) {
    return OpenDescriptorFile(storage, file_size, open_extent, layout);
  }
  return Status::Corrupt("not a vmdk image (no sparse header magic or descriptor)");
}

}  // namespace

Result<std::unique_ptr<VmdkImage>> VmdkImage::Open(std::unique_ptr<io::Storage> storage,
                                                   const std::string& filename,
                                                   const OpenExtentFn& open_extent) {
  if (!storage) return Status::InvalidArgument("VmdkImage::Open: null storage");
  Layout layout;
  Status s = OpenLayout(*storage, filename, open_extent, layout);
  if (!s.ok()) return s.WithContext(filename);

  block::DeviceInfo info;
  info.format = "vmdk";
  info.filename = filename;
  info.cluster_size = layout.sparse ? uint32_t(layout.sparse->header().grain_bytes()) : 0;
  info.preferred_block = 4096;
  std::unique_ptr<VmdkImage> image(new VmdkImage(std::move(info), layout.size));
  image->file_ = std::move(storage);
  image->extent_ = std::move(layout.extent);
  image->data_ = image->extent_ ? image->extent_.get() : image->file_.get();
  image->sparse_ = std::move(layout.sparse);
  image->flat_offset_ = layout.flat_offset;
  image->description_ = std::move(layout.description);
  return image;
}

Status VmdkImage::Read(uint64_t offset, std::span<uint8_t> buf) {
  TD_RETURN_IF_ERROR(CheckRead(offset, buf.size()));
  if (sparse_) return sparse_->Read(offset, buf);
  return data_->ReadAt(flat_offset_ + offset, buf);
}

Result<block::Extent> VmdkImage::GetStatus(uint64_t offset, uint64_t max_length) {
  TD_ASSIGN_OR_RETURN(uint64_t end, StatusEnd(offset, max_length));
  if (sparse_) return sparse_->GetStatus(offset, end);
  return block::PlainStatus(*data_, offset, flat_offset_ + offset, end - offset);
}

Result<uint64_t> VmdkImage::AllocatedBytes() {
  TD_ASSIGN_OR_RETURN(uint64_t total, file_->AllocatedBytes());
  if (extent_) {
    TD_ASSIGN_OR_RETURN(uint64_t extent_bytes, extent_->AllocatedBytes());
    total += extent_bytes;
  }
  return total;
}

Result<bool> Probe(io::Storage& storage) {
  std::array<uint8_t, kHeaderSize> head{};
  TD_RETURN_IF_ERROR(storage.ReadAt(0, head));
  uint32_t magic = LoadLe32(head.data());
  if (magic == kSparseMagic || magic == kCowdMagic) return true;
  if (!LooksLikeDescriptor(head)) return false;
  TD_ASSIGN_OR_RETURN(uint64_t size, storage.Size());
  return size <= kMaxDescriptorBytes;
}

}  // namespace thindisk::vmdk
