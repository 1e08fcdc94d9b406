#include "util/bit_vector.h"

#include <algorithm>
#include <bit>

namespace thindisk {
namespace {

// Bits [lo, hi) of a word, 0 <= lo < hi <= 64.
uint64_t WordMask(uint64_t lo, uint64_t hi) {
  uint64_t upper = hi == 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
  return upper & ~((uint64_t{1} << lo) - 1);
}

// Calls fn(word_index, mask) for each word that [first, end) touches.
template <typename Fn>
void ForEachWord(uint64_t first, uint64_t end, Fn fn) {
  while (first < end) {
    const uint64_t w = first >> 6;
    const uint64_t lo = first & 63;
    const uint64_t hi = std::min<uint64_t>(64, end - (w << 6));
    fn(w, WordMask(lo, hi));
    first = (w + 1) << 6;
  }
}

}  // namespace

void BitVector::Resize(uint64_t bits) {
  bits_ = bits;
  words_.resize((bits + 63) / 64, 0);
  TrimTail();
}

void BitVector::TrimTail() {
  if (bits_ % 64 != 0) words_.back() &= WordMask(0, bits_ % 64);
}

void BitVector::SetRange(uint64_t first, uint64_t count) {
  const uint64_t end = first + std::min(count, bits_ - std::min(first, bits_));
  ForEachWord(first, end, [&](uint64_t w, uint64_t mask) { words_[w] |= mask; });
}

void BitVector::ClearRange(uint64_t first, uint64_t count) {
  const uint64_t end = first + std::min(count, bits_ - std::min(first, bits_));
  ForEachWord(first, end, [&](uint64_t w, uint64_t mask) { words_[w] &= ~mask; });
}

void BitVector::ClearAll() { std::fill(words_.begin(), words_.end(), 0); }

bool BitVector::AllSet(uint64_t first, uint64_t count) const {
  const uint64_t end = first + std::min(count, bits_ - std::min(first, bits_));
  bool all = true;
  ForEachWord(first, end, [&](uint64_t w, uint64_t mask) { all &= (words_[w] & mask) == mask; });
  return all;
}

uint64_t BitVector::NextSet(uint64_t from) const {
  for (uint64_t w = from >> 6; w < words_.size(); ++w) {
    uint64_t word = words_[w];
    if (w == from >> 6) word &= ~((uint64_t{1} << (from & 63)) - 1);
    if (word != 0) return std::min(bits_, (w << 6) + uint64_t(std::countr_zero(word)));
  }
  return bits_;
}

uint64_t BitVector::NextClear(uint64_t from) const {
  for (uint64_t w = from >> 6; w < words_.size(); ++w) {
    uint64_t word = ~words_[w];
    if (w == from >> 6) word &= ~((uint64_t{1} << (from & 63)) - 1);
    if (word != 0) return std::min(bits_, (w << 6) + uint64_t(std::countr_zero(word)));
  }
  return bits_;
}

uint64_t BitVector::CountSet() const {
  uint64_t n = 0;
  for (uint64_t w : words_) n += uint64_t(std::popcount(w));
  return n;
}

void BitVector::Or(const BitVector& other) {
  const size_t n = std::min(words_.size(), other.words_.size());
  for (size_t i = 0; i < n; ++i) words_[i] |= other.words_[i];
  TrimTail();
}

void BitVector::ReadBytes(uint64_t byte_offset, std::span<uint8_t> out) const {
  for (uint64_t i = 0; i < out.size(); ++i) {
    const uint64_t b = byte_offset + i;
    out[i] = b / 8 < words_.size() ? uint8_t(words_[b / 8] >> (8 * (b % 8))) : 0;
  }
}

void BitVector::WriteBytes(uint64_t byte_offset, std::span<const uint8_t> in) {
  for (uint64_t i = 0; i < in.size(); ++i) {
    const uint64_t b = byte_offset + i;
    if (b / 8 >= words_.size()) break;
    const uint64_t shift = 8 * (b % 8);
    words_[b / 8] = (words_[b / 8] & ~(uint64_t{0xff} << shift)) | uint64_t{in[i]} << shift;
  }
  TrimTail();
}

}  // namespace thindisk
