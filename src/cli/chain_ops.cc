#include "cli/chain_ops.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "block/open.h"
#include "qcow2/image.h"

namespace thindisk::cli {

Result<size_t> FindLayer(const std::vector<ImageSummary>& chain, const std::string& path) {
  // As qemu-img: a relative name is first taken relative to the top image's
  // directory (as backing names are), then relative to the working directory.
  for (const std::string& candidate :
       {block::ResolveBackingName(chain.front().filename, path), path}) {
    if (block::IsUriName(candidate)) {  // an export or RADOS image: by name
      for (size_t i = 1; i < chain.size(); ++i) {
        if (chain[i].filename == candidate) return i;
      }
      continue;
    }
    struct stat want {};
    if (::stat(candidate.c_str(), &want) != 0) continue;
    for (size_t i = 1; i < chain.size(); ++i) {
      struct stat st {};
      if (::stat(chain[i].filename.c_str(), &st) == 0 && st.st_dev == want.st_dev &&
          st.st_ino == want.st_ino) {
        return i;
      }
    }
  }
  return Status::InvalidArgument("Did not find '" + path + "' in the backing chain of '" +
                                 chain.front().filename + "'");
}

Result<std::vector<StoredRange>> RangesAbove(block::Device& top, uint32_t depth) {
  std::vector<StoredRange> ranges;
  const uint64_t size = top.size();
  for (uint64_t offset = 0; offset < size;) {
    TD_ASSIGN_OR_RETURN(block::Extent e, top.GetStatus(offset, size - offset));
    if (e.length == 0) return Status::Internal("block status returned an empty extent");
    uint64_t length = std::min(e.length, size - offset);
    if (e.present && e.depth < depth) {
      bool zero = e.zero && !e.data;
      if (!ranges.empty() && ranges.back().zero == zero &&
          ranges.back().offset + ranges.back().length == offset) {
        ranges.back().length += length;
      } else {
        ranges.push_back({offset, length, zero});
      }
    }
    offset += length;
  }
  return ranges;
}

Status CopyRanges(block::Device& src, block::Device& dst,
                  const std::vector<StoredRange>& ranges, Progress& progress,
                  RateLimit* rate_limit) {
  uint64_t total = 0;
  for (const StoredRange& r : ranges) total += r.length;
  uint64_t done = 0;
  progress.Update(0, total);
  std::vector<uint8_t> buf;
  for (const StoredRange& r : ranges) {
    if (r.zero) {
      TD_RETURN_IF_ERROR(dst.WriteZeroes(r.offset, r.length, {}));
      done += r.length;
      progress.Update(done, total);
      continue;
    }
    for (uint64_t pos = r.offset; pos < r.offset + r.length;) {
      uint64_t n = std::min(kChainChunk, r.offset + r.length - pos);
      buf.resize(n);
      if (rate_limit != nullptr) rate_limit->Take(n);
      TD_RETURN_IF_ERROR(src.Read(pos, buf));
      TD_RETURN_IF_ERROR(dst.Write(pos, buf));
      pos += n;
      done += n;
      progress.Update(done, total);
    }
  }
  progress.Update(total, total);
  return Status::Ok();
}

Status CommitInto(block::Device& top, block::Device& base, uint32_t depth, bool empty_top,
                  Progress& progress, RateLimit* rate_limit) {
  auto* top_image = dynamic_cast<qcow2::Image*>(&top);
  if (empty_top && top_image == nullptr) {
    return Status::NotSupported(top.info().filename +
                                ": only qcow2 overlays can be emptied (use -d)");
  }
  TD_ASSIGN_OR_RETURN(std::vector<StoredRange> ranges, RangesAbove(top, depth));
  if (base.size() < top.size()) TD_RETURN_IF_ERROR(base.Resize(top.size()));
  TD_RETURN_IF_ERROR(CopyRanges(top, base, ranges, progress, rate_limit));
  TD_RETURN_IF_ERROR(base.Flush());
  TD_RETURN_IF_ERROR(base.Close());
  if (empty_top) TD_RETURN_IF_ERROR(top_image->Deallocate(0, top_image->size()));
  return Status::Ok();
}

}  // namespace thindisk::cli
