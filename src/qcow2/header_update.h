// Crash-safe rewrites of the header of a closed qcow2 image: backing file
// name and format (rebase, amend), compat level, feature bits, refcount
// table fields (amend).
//
// The header, its extensions and the backing file name all live in the first
// cluster. Only a 512-byte sector write is atomic, and the extension area of
// a v3 image with a feature name table is longer than one sector, so a
// rewrite is a sequence of ordered steps, each followed by a sync, such that
// after a crash at any point the image has either the old header or the new
// one (docs/write-ordering.md, event header_update):
//
//  1. If the new extension area differs from the old one beyond sector 0,
//     first switch to an intermediate header that is the old one without the
//     (purely informative) feature name table, whose extension area fits in
//     sector 0, with the old backing name copied to an unused place.
//  2. Write the new backing name and the new extension area beyond sector 0
//     into bytes of the header cluster that the header on disk does not use.
//  3. Write sector 0 in one write: the switch.
//
// Unknown extensions (bitmaps, anything newer) are kept byte for byte. Where
// the header cluster has no room for these steps (512-byte clusters hold
// everything in sector 0 anyway; a name near 1023 bytes in a 1 KiB cluster
// may not) the new header is written in one write.
//
// REQUIRES: nothing has the image open for writing; any data the new header
// relies on (copied clusters, new refcount structures) is already durable.
// Thread safety: none; one caller per storage.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/storage.h"
#include "qcow2/format.h"
#include "util/result.h"

namespace thindisk::qcow2 {

// The header as on disk and the raw bytes of the first cluster.
struct HeaderCluster {
  Header header;
  std::vector<uint8_t> bytes;  // min(cluster size, file size) bytes
};
Result<HeaderCluster> ReadHeaderCluster(io::Storage& storage);

// Writes `new_header` in place of the header on disk, by the steps above,
// and syncs. `new_header.cluster_bits` must equal the current one.
// backing_file_offset/size in `new_header` are ignored (placement is chosen
// here). Errors: kInvalidArgument if the new header does not fit in a
// cluster or changes the cluster size; storage errors.
Status RewriteHeader(io::Storage& storage, const Header& new_header);

// Reads the header, lets `edit` change it, and rewrites it as above.
Status UpdateHeader(io::Storage& storage, const std::function<Status(Header&)>& edit);

// Sets (or, with an empty name, removes) the backing file name and format.
// An empty `format` removes the backing format extension.
Status SetBackingFile(io::Storage& storage, const std::string& name, const std::string& format);

// End of the extension area (past the end marker) of the header in `bytes`,
// as `h` decoded it. Exposed for tests.
uint64_t ExtensionAreaEnd(const Header& h, std::span<const uint8_t> bytes);

}  // namespace thindisk::qcow2
