// ImageSummary: what `info` and `create -b` need to know about an image
// file, read from its header alone (no engine, no backing files), so it works
// on any image we can decode, including ones the engine would refuse to open
// read-write.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/storage.h"
#include "qcow2/format.h"
#include "util/result.h"
#include "vmdk/vmdk_image.h"

namespace thindisk::cli {

struct ImageSummary {
  std::string filename;  // as given
  std::string format;    // "qcow2" or "raw"
  uint64_t virtual_size = 0;
  uint64_t actual_size = 0;  // host bytes allocated
  std::optional<qcow2::Header> header;  // qcow2 only
  // qcow2 with a backing file: the name as stored and the path it resolves
  // to (relative to this image's directory).
  std::string backing_filename;
  std::string full_backing_filename;
  std::vector<qcow2::Snapshot> snapshots;  // qcow2 internal snapshots
  // qcow2 persistent bitmaps, as the directory has them; why they cannot be
  // listed ("" when they can: none, or all of them).
  std::vector<qcow2::BitmapDirectoryEntry> bitmaps;
  std::string bitmaps_problem;
  // vmdk and vpc (read through their drivers): the grain / block size (0
  // when there is none) and, for vmdk, what qemu-img reports of it.
  uint32_t cluster_size = 0;
  std::optional<vmdk::Description> vmdk;
};

// Decodes the qcow2 header at the start of `storage`.
Result<qcow2::Header> ReadQcow2Header(io::Storage& storage);

// Summarizes `filename`; `format` "" probes (qcow2 magic or raw). Reads
// under qemu's read lock (io/qemu_lock.h: refused while a writer holds the
// image), or with force_share (-U) under kForceShare.
Result<ImageSummary> ReadImageSummary(const std::string& filename, const std::string& format,
                                      bool force_share = false);

// The summaries of `filename` and every backing file below it, top first.
// Refuses loops and chains deeper than block::kDefaultMaxChainDepth.
Result<std::vector<ImageSummary>> ReadBackingChain(const std::string& filename,
                                                   const std::string& format,
                                                   bool force_share = false);

// The backing files below `filename` (of `format`, "" to probe) as they
// resolve, top first, from headers read with any lock shared. An NBD
// export ends the list unread: its server may take one client at a time,
// and the caller's own open may be that client. A loop ends it too (its
// image named once), as does a header that cannot be read.
std::vector<std::string> BackingNamesBelow(const std::string& filename,
                                           const std::string& format);

// Refuses giving `image` the backing file `backing` (as stored; `path` is
// where it resolves) when that makes a loop: `path` is `image` itself, or,
// with `format` given, `image` lies further down the chain below `path`
// (as far as that chain can be read: one that cannot is left to whoever
// opens it). kInvalidArgument naming the chain.
Status RefuseBackingLoop(const std::string& image, const std::string& backing,
                         const std::string& path, const std::string& format);

// Refuses writing `target` while `source` (of `format`, "" to probe) is
// read, when `target` is a backing file of `source`: the copy would
// overwrite what it reads (with -U no lock stops it). Headers only, any
// lock shared; a chain that cannot be read is left to whoever opens it.
// kInvalidArgument naming the chain.
Status RefuseTargetUnderSource(const std::string& source, const std::string& format,
                               const std::string& target);

// `top` and the backing files `below` it (as BackingNamesBelow gives
// them) as "top -> b -> c" when `target` is one of those below, else
// nullopt. No I/O but stat().
std::optional<std::string> ChainHolding(const std::string& top,
                                        const std::vector<std::string>& below,
                                        const std::string& target);

}  // namespace thindisk::cli
