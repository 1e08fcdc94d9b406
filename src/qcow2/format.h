// qcow2 on-disk structures: pure encode/decode and validation, no I/O.
//
// Written from the qcow2 specification (docs/interop/qcow2.txt in QEMU).
// Field names follow the specification. Everything decoded from bytes is
// untrusted and validated against the named limits below before use.
//
// This header holds the header codec (fixed fields, extensions, backing
// name) and the limits; it includes the other two codecs, so one include
// gives all of the format: table entries (L1, L2, refcount) in
// qcow2/table_entry.h and the snapshot table in qcow2/snapshot_table.h.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "qcow2/bitmap_directory.h"
#include "qcow2/snapshot_table.h"
#include "qcow2/table_entry.h"
#include "util/result.h"

namespace thindisk::qcow2 {

inline constexpr uint32_t kMagic = 0x514649fb;  // 'Q' 'F' 'I' 0xfb

// Limits, each with its reason.
inline constexpr uint32_t kMinClusterBits = 9;   // spec: cluster_bits >= 9 (512 B)
inline constexpr uint32_t kMaxClusterBits = 21;  // spec: QEMU supports at most 2 MiB
// Extended L2 entries split a cluster into 32 subclusters of at least 512 B.
inline constexpr uint64_t kMinExtendedL2ClusterSize = 16 * 1024;
inline constexpr uint32_t kV2HeaderLength = 72;
inline constexpr uint32_t kV3HeaderLength = 104;  // v3 fields up to header_length; compression_type follows when longer
inline constexpr uint32_t kMaxBackingFileSize = 1023;  // spec: must not exceed 1023 bytes
// An L1 table larger than 32 MiB (4 Mi entries) is refused, as QEMU does: it
// would need more memory than any sane image and is how hostile images try
// to make us allocate gigabytes.
inline constexpr uint64_t kMaxL1Bytes = 32ull << 20;
// Refcount table: same reasoning (QEMU's limit is 8 MiB).
inline constexpr uint64_t kMaxRefcountTableBytes = 8ull << 20;
// Virtual size limit: 2^61 bytes keeps offsets and sums in uint64_t.
inline constexpr uint64_t kMaxVirtualSize = 1ull << 61;
// Snapshot table: at most 65536 snapshots (spec).
inline constexpr uint32_t kMaxSnapshots = 65536;

// Incompatible feature bits.
inline constexpr uint64_t kIncompatDirty = 1ull << 0;
inline constexpr uint64_t kIncompatCorrupt = 1ull << 1;
inline constexpr uint64_t kIncompatDataFile = 1ull << 2;
inline constexpr uint64_t kIncompatCompression = 1ull << 3;
inline constexpr uint64_t kIncompatExtendedL2 = 1ull << 4;
inline constexpr uint64_t kIncompatKnown = kIncompatDirty | kIncompatCorrupt |
                                           kIncompatCompression | kIncompatExtendedL2;
// Compatible feature bits.
inline constexpr uint64_t kCompatLazyRefcounts = 1ull << 0;
// Autoclear bits we understand: the bitmaps bit (kAutoclearBitmaps, in
// qcow2/bitmap_directory.h), which the engine keeps set while it tracks
// every change in the bitmaps. Others (raw external data) are cleared when
// we open read-write, as the spec requires of software that does not
// maintain them.
inline constexpr uint64_t kAutoclearKnown = kAutoclearBitmaps;

// Header extension types.
inline constexpr uint32_t kExtEnd = 0x00000000;
inline constexpr uint32_t kExtBackingFormat = 0xe2792aca;
inline constexpr uint32_t kExtFeatureNameTable = 0x6803f857;
inline constexpr uint32_t kExtBitmaps = 0x23852875;
inline constexpr uint32_t kExtFullDiskEncryption = 0x0537be77;
inline constexpr uint32_t kExtExternalDataFile = 0x44415441;

enum class CompressionType : uint8_t { kZlib = 0, kZstd = 1 };

struct FeatureName {
  uint8_t type = 0;  // 0 incompatible, 1 compatible, 2 autoclear
  uint8_t bit = 0;
  std::string name;  // up to 46 bytes
};

// An extension we do not interpret, kept byte for byte on rewrite.
struct RawExtension {
  uint32_t type = 0;
  std::vector<uint8_t> data;
};

struct Header {
  uint32_t version = 3;
  uint64_t backing_file_offset = 0;
  uint32_t backing_file_size = 0;
  uint32_t cluster_bits = 16;
  uint64_t size = 0;  // virtual size in bytes
  uint32_t crypt_method = 0;
  uint32_t l1_size = 0;  // entries
  uint64_t l1_table_offset = 0;
  uint64_t refcount_table_offset = 0;
  uint32_t refcount_table_clusters = 0;
  uint32_t nb_snapshots = 0;
  uint64_t snapshots_offset = 0;
  // Version 3 fields (version 2 images decode as: features 0, refcount_order 4,
  // header_length 72, compression zlib).
  uint64_t incompatible_features = 0;
  uint64_t compatible_features = 0;
  uint64_t autoclear_features = 0;
  uint32_t refcount_order = 4;
  uint32_t header_length = kV3HeaderLength;
  CompressionType compression_type = CompressionType::kZlib;

  // From extensions and the backing file name area.
  std::string backing_file;
  std::string backing_format;  // empty when no extension
  std::vector<FeatureName> feature_names;
  // The bitmaps extension, when it is there and consistent (autoclear bit
  // 0 set, version 3). An inconsistent one (a program that does not keep
  // bitmaps wrote the image) is kept verbatim among the unknown extensions:
  // its bitmaps are not used, and its clusters stay referenced.
  std::optional<BitmapsExtension> bitmaps;
  std::vector<RawExtension> unknown_extensions;  // kept verbatim

  uint64_t cluster_size() const { return 1ull << cluster_bits; }
  bool extended_l2() const { return incompatible_features & kIncompatExtendedL2; }
  uint32_t refcount_bits() const { return 1u << refcount_order; }
  // Bytes per L2 entry: 8, or 16 with extended L2.
  uint32_t l2_entry_size() const { return extended_l2() ? 16 : 8; }
  uint64_t l2_entries() const { return cluster_size() / l2_entry_size(); }
  uint32_t subclusters_per_cluster() const { return extended_l2() ? 32 : 1; }
  uint64_t subcluster_size() const { return cluster_size() / subclusters_per_cluster(); }
};

// Decodes and validates the header from the start of the file. `bytes` holds
// at least the first min(file_size, 2 MiB) bytes of the file (the header,
// its extensions and the backing name must all lie in the first cluster).
// `file_size` is the host file's size, used to check that the tables it
// names lie inside the file. Errors are kCorrupt (malformed) or
// kNotSupported (valid but a feature we refuse, e.g. encryption, external
// data file, unknown incompatible bit: the message names the bit and, when
// the feature name table has it, its name).
Result<Header> DecodeHeader(std::span<const uint8_t> bytes, uint64_t file_size);

// Encodes header, extensions (bitmaps, backing format, feature name table,
// unknown extensions in order, end marker) and the backing file name, which is
// placed right after the extensions (backing_file_offset and
// backing_file_size are computed, not taken from `h`). The result is at most
// one cluster; kInvalidArgument if it would not fit. Version 2 headers are
// encoded without v3 fields and without the feature name table.
Result<std::vector<uint8_t>> EncodeHeader(const Header& h);

// The feature name table thindisk writes into every v3 header it creates.
std::vector<FeatureName> DefaultFeatureNames();

}  // namespace thindisk::qcow2
