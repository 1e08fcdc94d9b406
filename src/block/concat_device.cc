// See concat_device.h.
#include "block/concat_device.h"

#include <algorithm>
#include <cstring>

namespace thindisk::block {
namespace {

constexpr uint64_t kSector = 512;

DeviceInfo ConcatInfo(const std::vector<std::unique_ptr<Device>>& parts) {
  DeviceInfo info = parts.front()->info();
  for (size_t i = 1; i < parts.size(); ++i)
    info.filename += " + " + parts[i]->info().filename;
  return info;
}

std::vector<uint64_t> Starts(const std::vector<std::unique_ptr<Device>>& parts) {
  std::vector<uint64_t> starts{0};
  for (const auto& part : parts) {
    starts.push_back(starts.back() + (part->size() + kSector - 1) / kSector * kSector);
  }
  return starts;
}

}  // namespace

ConcatDevice::ConcatDevice(std::vector<std::unique_ptr<Device>> parts)
    : ConcatDevice(Starts(parts), std::move(parts)) {}

ConcatDevice::ConcatDevice(std::vector<uint64_t>&& starts,
                           std::vector<std::unique_ptr<Device>>&& parts)
    : ReadOnlyImage(ConcatInfo(parts), starts.back()),
      parts_(std::move(parts)),
      starts_(std::move(starts)) {}

size_t ConcatDevice::PartAt(uint64_t offset) const {
  // The last start not past offset (empty parts share a start: take the last).
  auto it = std::upper_bound(starts_.begin(), starts_.end(), offset);
  return static_cast<size_t>(it - starts_.begin()) - 1;
}

Status ConcatDevice::Read(uint64_t offset, std::span<uint8_t> buf) {
  TD_RETURN_IF_ERROR(CheckRead(offset, buf.size()));
  while (!buf.empty()) {
    const size_t i = PartAt(offset);
    const uint64_t in_part = offset - starts_[i];
    const uint64_t n = std::min<uint64_t>(buf.size(), starts_[i + 1] - offset);
    const uint64_t real = parts_[i]->size();
    // Bytes of the part itself, then its sector padding (zeros).
    const uint64_t data = in_part < real ? std::min(n, real - in_part) : 0;
    if (data > 0) TD_RETURN_IF_ERROR(parts_[i]->Read(in_part, buf.first(data)));
    std::memset(buf.data() + data, 0, n - data);
    buf = buf.subspan(n);
    offset += n;
  }
  return Status::Ok();
}

Result<Extent> ConcatDevice::GetStatus(uint64_t offset, uint64_t max_length) {
  TD_RETURN_IF_ERROR(CheckRead(offset, 0));
  if (offset >= size()) return CheckRead(offset, 1);
  const size_t i = PartAt(offset);
  const uint64_t in_part = offset - starts_[i];
  const uint64_t real = parts_[i]->size();
  const uint64_t limit = std::min(max_length, starts_[i + 1] - offset);
  Extent e;
  if (in_part >= real) {  // the padding
    e.offset = offset;
    e.length = limit;
    e.zero = true;
    return e;
  }
  TD_ASSIGN_OR_RETURN(e, parts_[i]->GetStatus(in_part, std::min(limit, real - in_part)));
  e.offset += starts_[i];
  e.length = std::min(e.length, limit);
  e.has_host_offset = false;
  e.host_offset = 0;
  return e;
}

Status ConcatDevice::Close() {
  Status first = ReadOnlyImage::Close();
  for (auto& part : parts_) {
    Status s = part->Close();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

}  // namespace thindisk::block
