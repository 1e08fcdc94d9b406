#include "crash/content_model.h"

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <random>

namespace thindisk::crash {
namespace {

constexpr uint64_t kInFlight = std::numeric_limits<uint64_t>::max();

// 64 KiB of fixed pseudo-random bytes: requests read windows of it, so
// their data is incompressible and differs between ids, yet costs no more
// than a table lookup per byte.
const std::array<uint8_t, 65536>& Table() {
  static const auto* table = [] {
    auto* t = new std::array<uint8_t, 65536>;
    std::mt19937_64 rng(0x7468696e6469736bull);
    for (auto& b : *t) b = uint8_t(rng() >> 24);
    return t;
  }();
  return *table;
}

}  // namespace

uint8_t ValueOf(Fill fill, uint32_t id, uint64_t off) {
  switch (fill) {
    case Fill::kPattern:
      return Table()[(off + uint64_t(id) * 40503u) & 0xffff] ^ uint8_t(id * 151u);
    case Fill::kCompressible:
      return uint8_t((off >> 7) * 31u + id * 17u);
    case Fill::kZero:
      return 0;
  }
  return 0;
}

void FillBytes(Fill fill, uint32_t id, uint64_t off, std::span<uint8_t> out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = ValueOf(fill, id, off + i);
}

ContentModel::ContentModel(uint64_t size, const std::vector<uint8_t>& initial)
    : size_(size), initial_(initial) {}

void ContentModel::Grow(uint64_t new_size) {
  std::lock_guard lock(mu_);
  size_ = std::max(size_, new_size);
}

uint32_t ContentModel::Begin(Fill fill, uint64_t offset, uint64_t length) {
  std::lock_guard lock(mu_);
  ops_.push_back(Op{fill, offset, length, ++seq_, kInFlight, false, false});
  return uint32_t(ops_.size());
}

void ContentModel::End(uint32_t id, bool ok) {
  std::lock_guard lock(mu_);
  Op& op = ops_[id - 1];
  op.end_seq = ++seq_;
  op.ok = ok;
}

uint64_t ContentModel::FlushBegin() {
  std::lock_guard lock(mu_);
  return ++seq_;
}

void ContentModel::MarkDurable(uint32_t id) {
  std::lock_guard lock(mu_);
  ops_[id - 1].fua_durable = true;
}

void ContentModel::FlushEnd(uint64_t token, bool ok) {
  std::lock_guard lock(mu_);
  ++seq_;
  if (ok) durable_point_ = std::max(durable_point_, token);
}

std::string ContentModel::Verify(std::span<const uint8_t> actual) const {
  std::lock_guard lock(mu_);
  const uint64_t n = std::min<uint64_t>(actual.size(), size_);
  // The last durable request per byte (0: none), painted in completion order.
  thread_local std::vector<uint32_t> durable;  // reused: big, and one per worker
  durable.assign(n, 0);
  std::vector<uint32_t> order;
  std::vector<uint32_t> pending;  // ids of requests that may or may not have landed
  for (uint32_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    if (op.ok && (op.end_seq < durable_point_ || op.fua_durable)) {
      order.push_back(i + 1);
    } else {
      pending.push_back(i + 1);
    }
  }
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return ops_[a - 1].end_seq < ops_[b - 1].end_seq; });
  for (uint32_t id : order) {
    const Op& op = ops_[id - 1];
    if (op.offset >= n) continue;
    uint64_t end = std::min(n, op.offset + op.length);
    std::fill(durable.begin() + op.offset, durable.begin() + end, id);
  }

  std::string out;
  uint64_t mismatches = 0;
  for (uint64_t b = 0; b < n; ++b) {
    uint32_t d = durable[b];
    uint8_t expected = d ? ValueOf(ops_[d - 1].fill, d, b) : Initial(b);
    if (actual[b] == expected) continue;
    uint64_t after = d ? ops_[d - 1].end_seq : 0;
    bool fits = false;
    for (uint32_t id : pending) {
      const Op& op = ops_[id - 1];
      if (b < op.offset || b - op.offset >= op.length || op.end_seq <= after) continue;
      if (ValueOf(op.fill, id, b) == actual[b]) {
        fits = true;
        break;
      }
    }
    if (fits) continue;
    if (++mismatches == 1) {
      // The history of the first bad byte, for the failure message.
      char line[200];
      snprintf(line, sizeof line, "requests covering guest byte 0x%" PRIx64
               " (durable point: seq %" PRIu64 "):\n", b, durable_point_);
      out += line;
      for (uint32_t i = 0; i < ops_.size(); ++i) {
        const Op& op = ops_[i];
        if (b < op.offset || b - op.offset >= op.length) continue;
        snprintf(line, sizeof line,
                 "  request %u: %s [0x%" PRIx64 ", +0x%" PRIx64 ") seq %" PRIu64 "-%" PRIu64
                 " %s, value here 0x%02x\n",
                 i + 1, op.fill == Fill::kZero ? "zero" : "write", op.offset, op.length,
                 op.begin_seq, op.end_seq, op.ok ? "ok" : "FAILED", ValueOf(op.fill, i + 1, b));
        out += line;
      }
    }
    if (mismatches <= 4) {
      char line[200];
      snprintf(line, sizeof line,
               "guest byte 0x%" PRIx64 " reads 0x%02x; expected 0x%02x (%s%u) or an unflushed "
               "request's value\n",
               b, actual[b], expected, d ? "request " : "initial", d);
      out += line;
    }
  }
  if (mismatches > 4) out += "... " + std::to_string(mismatches) + " bytes in all\n";
  return out;
}

}  // namespace thindisk::crash
