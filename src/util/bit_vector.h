// BitVector: a dense array of bits, as a dirty bitmap keeps them in memory
// (one bit per granule of a disk), with the byte layout of bitmap data in a
// qcow2 image: bit i is bit (i % 8) of byte (i / 8), least significant first.
//
// Thread safety: none; the owner serializes access.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace thindisk {

class BitVector {
 public:
  BitVector() = default;
  explicit BitVector(uint64_t bits) { Resize(bits); }

  uint64_t size() const { return bits_; }
  // Grows (new bits clear) or shrinks (bits past the end are dropped).
  void Resize(uint64_t bits);

  bool Test(uint64_t i) const { return words_[i >> 6] >> (i & 63) & 1; }
  // Sets or clears bits [first, first + count), clipped to size().
  void SetRange(uint64_t first, uint64_t count);
  void ClearRange(uint64_t first, uint64_t count);
  void ClearAll();
  // Whether every bit of [first, first + count) is set (clipped to size()).
  bool AllSet(uint64_t first, uint64_t count) const;
  // The first set (clear) bit at or after `from`, or size() when none.
  uint64_t NextSet(uint64_t from) const;
  uint64_t NextClear(uint64_t from) const;
  uint64_t CountSet() const;
  // this |= other (bits past this->size() are ignored).
  void Or(const BitVector& other);
  bool operator==(const BitVector& other) const = default;

  // Bytes of the serialized form: (size() + 7) / 8.
  uint64_t ByteSize() const { return (bits_ + 7) / 8; }
  // Copies serialized bytes [byte_offset, byte_offset + out.size()) into
  // `out`; bytes past ByteSize() read as zeros.
  void ReadBytes(uint64_t byte_offset, std::span<uint8_t> out) const;
  // Sets the bits from serialized bytes at `byte_offset` (bits past size()
  // are ignored, so a cluster's zero tail is harmless).
  void WriteBytes(uint64_t byte_offset, std::span<const uint8_t> in);

 private:
  void TrimTail();  // bits past bits_ in the last word stay zero

  uint64_t bits_ = 0;
  std::vector<uint64_t> words_;
};

}  // namespace thindisk
