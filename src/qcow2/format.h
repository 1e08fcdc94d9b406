// qcow2 on-disk structures: pure encode/decode and validation, no I/O.
//
// Written from the qcow2 specification (docs/interop/qcow2.txt in QEMU).
// Field names follow the specification. Everything decoded from bytes is
// untrusted and validated against the named limits below before use.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/result.h"

namespace thindisk::qcow2 {

inline constexpr uint32_t kMagic = 0x514649fb;  // 'Q' 'F' 'I' 0xfb

// Limits, each with its reason.
inline constexpr uint32_t kMinClusterBits = 9;   // spec: cluster_bits >= 9 (512 B)
inline constexpr uint32_t kMaxClusterBits = 21;  // spec: QEMU supports at most 2 MiB
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
// Autoclear bits we understand (none: bitmaps and raw external data are
// cleared when we open read-write, as the spec requires of software that
// does not maintain them).
inline constexpr uint64_t kAutoclearKnown = 0;

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
  std::vector<RawExtension> unknown_extensions;  // includes bitmaps, kept verbatim

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

// Encodes header, extensions (backing format, feature name table, unknown
// extensions in order, end marker) and the backing file name, which is
// placed right after the extensions (backing_file_offset and
// backing_file_size are computed, not taken from `h`). The result is at most
// one cluster; kInvalidArgument if it would not fit. Version 2 headers are
// encoded without v3 fields and without the feature name table.
Result<std::vector<uint8_t>> EncodeHeader(const Header& h);

// The feature name table thindisk writes into every v3 header it creates.
std::vector<FeatureName> DefaultFeatureNames();

// ---- L1 / L2 entries ----

inline constexpr uint64_t kOffsetMask = 0x00fffffffffffe00ull;  // bits 9-55
inline constexpr uint64_t kCopied = 1ull << 63;                // refcount == 1
inline constexpr uint64_t kCompressed = 1ull << 62;
inline constexpr uint64_t kZeroFlag = 1ull << 0;  // standard L2 only (v3)
inline constexpr uint64_t kL1Reserved = 0x7f000000000001ffull;  // must be zero

// L1 entry: offset of the L2 table (0 = unallocated) and the COPIED flag.
inline uint64_t L1Offset(uint64_t entry) { return entry & kOffsetMask; }

enum class ClusterKind : uint8_t {
  kUnallocated,  // reads from backing, or zeros
  kZero,         // reads as zeros (standard L2 zero flag; host offset may be kept)
  kNormal,       // data at host_offset (extended L2: per-subcluster state applies)
  kCompressed,   // compressed data at host_offset, compressed_size bytes
};

struct L2Mapping {
  ClusterKind kind = ClusterKind::kUnallocated;
  uint64_t host_offset = 0;      // cluster-aligned for kNormal/kZero; byte offset if compressed
  uint64_t compressed_size = 0;  // kCompressed: bytes to read starting at host_offset
  bool copied = false;
  // Extended L2 only: bit i of alloc = subcluster i allocated; bit i of zero
  // = subcluster i reads as zeros.
  uint32_t alloc_bitmap = 0;
  uint32_t zero_bitmap = 0;
};

// Decodes one L2 entry (and, for extended L2, its bitmap word). Validates
// reserved bits, alignment of host offsets (kCorrupt: "unaligned L2 entry").
// For compressed clusters the offset/size split depends on cluster_bits.
Result<L2Mapping> DecodeL2Entry(uint64_t entry, uint64_t bitmap, bool extended_l2,
                                uint32_t cluster_bits);
// Inverse of DecodeL2Entry: returns {entry, bitmap}.
struct L2Words {
  uint64_t entry = 0;
  uint64_t bitmap = 0;
};
L2Words EncodeL2Entry(const L2Mapping& m, bool extended_l2, uint32_t cluster_bits);

// ---- refcounts ----

// Reads/writes entry `index` of a refcount block of width 2^refcount_order
// bits (big-endian, spec layout). REQUIRES: index within the block, value fits.
uint64_t GetRefcount(std::span<const uint8_t> block, uint32_t refcount_order, uint64_t index);
void SetRefcount(std::span<uint8_t> block, uint32_t refcount_order, uint64_t index,
                 uint64_t value);
inline uint64_t MaxRefcount(uint32_t refcount_order) {
  return refcount_order == 6 ? ~0ull : (1ull << (1u << refcount_order)) - 1;
}

// ---- snapshots ----

struct Snapshot {
  uint64_t l1_table_offset = 0;
  uint32_t l1_size = 0;
  std::string id;  // unique id string
  std::string name;
  uint32_t date_sec = 0;
  uint32_t date_nsec = 0;
  uint64_t vm_clock_nsec = 0;
  uint32_t vm_state_size = 0;
  // Extra data (spec: >= 16 bytes in v3): large vm state size, disk size,
  // icount; kept verbatim beyond what we interpret.
  uint64_t vm_state_size_large = 0;
  uint64_t disk_size = 0;
  std::vector<uint8_t> extra;  // full extra data as read (or built)
};

// Decodes `nb_snapshots` entries from the table bytes. Validates lengths,
// alignment (entries are 8-byte aligned), l1 offsets cluster-aligned.
Result<std::vector<Snapshot>> DecodeSnapshotTable(std::span<const uint8_t> bytes,
                                                  uint32_t nb_snapshots, uint32_t cluster_bits);
std::vector<uint8_t> EncodeSnapshotTable(const std::vector<Snapshot>& snapshots);

}  // namespace thindisk::qcow2
