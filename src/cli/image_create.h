// Creating an image file from qemu-img style settings: shared by `create`
// and `convert` (which creates its destination the same way).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qcow2/image.h"
#include "raw/raw_image.h"
#include "util/result.h"

namespace thindisk::cli {

// The settings one create run ends up with, from flags and -o together.
struct CreatePlan {
  std::string format;
  bool have_size = false;
  uint64_t size = 0;
  std::string backing_file;
  std::string backing_format;
  qcow2::CreateOptions qcow2;
  raw::RawPrealloc raw_prealloc = raw::RawPrealloc::kOff;
  std::string preallocation_text;  // as given, for the "Formatting" line
  std::string compat_text;
  // -o object_size: a rados:// image's data object size (0: 4 MiB).
  uint64_t object_size = 0;
  // Whether -o named these, so compat=0.10 can drop our v3-only defaults.
  bool extended_l2_given = false;
  bool compression_type_given = false;
};

// qemu's qcow2 preallocation names (off, metadata, falloc, full);
// kInvalidArgument for any other.
Result<qcow2::Preallocation> ParseQcow2Prealloc(const std::string& v);

// Applies one -o key=value to `plan` (plan.format must be set first).
// kInvalidArgument names the key or value that is wrong.
Status ApplyCreateOption(CreatePlan& plan, const std::string& key, const std::string& value);

// Applies every "-o" string in order. With compat=0.10 (v2), the v3-only
// defaults (extended L2, zstd) fall back to what v2 can store unless -o
// asked for them explicitly (then creation fails with the reason).
Status ApplyCreateOptions(CreatePlan& plan, const std::vector<std::string>& option_strings);

// Clusters under 16 KiB cannot have extended L2 entries: unless -o asked
// for them (creation then fails with the reason), such a cluster size turns
// the default off, as qemu-img's default is. ApplyCreateOptions calls it;
// call it again after setting cluster_size another way.
void DefaultExtendedL2(CreatePlan& plan);

// qemu-img's "Formatting 'FILE', fmt=qcow2 cluster_size=... size=..." line.
std::string FormattingLine(const std::string& filename, const CreatePlan& plan);

// Creates (or truncates) `filename` and writes an empty image per `plan`.
// On failure after the file was created, removes it so no half-made image
// is left. A fallback the host forced (falloc -> zeros) is printed as a
// warning on stderr.
// An NBD URI is created with CreateOnExport, and so is an existing block
// device (or a link to one): it keeps its size and its node, and must hold
// the image (`src`, when given, is measured for that). Any other node that
// is not a regular file (a character device such as /dev/null, a
// directory, a FIFO) is refused, untouched. A rados:// image is never
// overwritten: kBusy when it exists (qemu-img's rbd driver refuses too;
// remove it first with thindisk rm).
Status CreateImageFile(const std::string& filename, const CreatePlan& plan,
                       block::Device* src = nullptr);

// Whether `source` and `destination` name one image, so that writing the
// destination would destroy what is read: "export" (the same NBD URI),
// "image" (the same rados:// pool and image, whatever the query says, or
// the same name of anything else), "file" (one file by device and inode,
// through any name or link); nullptr when they are different images.
const char* SameImage(const std::string& source, const std::string& destination);

// Removes what CreateImageFile made, after a later step failed (convert's
// copy): unlinks a regular file, removes a rados:// image's objects; leaves
// an export and a block device as they are. Best effort: the first error
// is what the caller reports.
void RemoveCreatedImage(const std::string& filename);

// Lays an empty image on the NBD export `uri` (or, through
// CreateImageFile, on a block device), so that what a copy skips (zero
// extents) reads as zeros there, as on a new file:
//  - raw: the export itself is the image; its first plan.size bytes are
//    zeroed with write-zeroes (the server may punch them), not written.
//  - qcow2: created at the export's start through nbdclient::ExportFile;
//    the export must hold the image: its fully allocated size, or, with a
//    source to measure (`src`, may be null), what qcow2::Measure says that
//    source needs. Errors: kNoSpace naming both sizes.
Status CreateOnExport(const std::string& uri, const CreatePlan& plan, block::Device* src);

}  // namespace thindisk::cli
