#include "nbdclient/nbd_storage.h"

#include <libnbd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "nbdclient/connection.h"

namespace thindisk::nbdclient {
namespace {

// The NBD spec lets a server that names no maximum block size refuse
// requests over 32 MiB, so that is the largest read or write sent then.
constexpr uint64_t kDefaultMaxRequest = 32ull << 20;
// WRITE_ZEROES and BLOCK_STATUS carry 32-bit lengths; 1 GiB pieces stay
// well inside that and aligned to anything a server asks for.
constexpr uint64_t kMaxRangeRequest = 1ull << 30;
// Zero-filled writes for servers without WRITE_ZEROES.
constexpr uint64_t kZeroBufferBytes = 1ull << 20;
// Connections to a multi-conn export (nbdcopy's default too): the first,
// and the rest joining in the background.
constexpr size_t kMaxConnections = 4;

class NbdStorage final : public io::Storage {
 public:
  NbdStorage(std::string uri, bool read_only) : uri_(std::move(uri)), read_only_(read_only) {}

  // The connections go first (their loops call back into this object),
  // the extra ones before the first.
  ~NbdStorage() override {
    while (!conns_.empty()) conns_.pop_back();
  }

  Status Connect() {
    // 1. The first connection, in the foreground: its errors are the user's.
    conns_.push_back(std::make_unique<Connection>(uri_, mu_));
    Connection& first = *conns_.front();
    TD_RETURN_IF_ERROR(first.Connect());
    nbd_handle* h = first.handle();

    // 2. What the server offers.
    int64_t size = nbd_get_size(h);
    if (size < 0) return LibnbdError(uri_);
    size_ = uint64_t(size);
    server_read_only_ = nbd_is_read_only(h) == 1;
    read_only_ = read_only_ || server_read_only_;
    can_flush_ = nbd_can_flush(h) == 1;
    can_zero_ = nbd_can_zero(h) == 1;
    have_allocation_ = nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
    int64_t min_block = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
    min_block_ = min_block > 1 ? uint64_t(min_block) : 1;
    if (min_block_ > (64u << 10) || (min_block_ & (min_block_ - 1)) != 0) {
      return Status::NotSupported(uri_ + ": the server's minimum block size " +
                                  std::to_string(min_block_) + " is not supported");
    }
    int64_t max_block = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
    max_request_ = max_block > 0 ? std::min<uint64_t>(uint64_t(max_block), 64ull << 20)
                                 : kDefaultMaxRequest;
    usable_.push_back(&first);
    // More connections when the server says every connection sees the
    // others' completed writes and a flush on one covers all (multi-conn):
    // opened once requests overlap (Issue), so a command that asks one
    // thing at a time (info, map) makes one connection.
    multi_conn_ = nbd_can_multi_conn(h) == 1;
    return Status::Ok();
  }

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override {
    if (Aligned(offset, buf.size())) return ReadBlocks(offset, buf);
    // A server with a minimum block size refuses smaller requests: read the
    // whole blocks around the range.
    const uint64_t start = AlignDown(offset), end = AlignUp(offset + buf.size());
    std::vector<uint8_t> bounce(end - start);
    TD_RETURN_IF_ERROR(ReadBlocks(start, bounce));
    std::copy_n(bounce.begin() + ptrdiff_t(offset - start), buf.size(), buf.begin());
    return Status::Ok();
  }

  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    TD_RETURN_IF_ERROR(CheckWritable(offset, buf.size(), "write"));
    if (Aligned(offset, buf.size())) {
      std::shared_lock<std::shared_mutex> lock(rmw_mu_);
      TD_RETURN_IF_ERROR(WriteBlocks(offset, buf));
    } else {
      // Read-modify-write of the partial head and tail blocks, exclusive
      // of every other write, so no neighbour's bytes in those blocks are
      // overwritten with stale ones.
      std::unique_lock<std::shared_mutex> lock(rmw_mu_);
      const uint64_t start = AlignDown(offset), end = AlignUp(offset + buf.size());
      std::vector<uint8_t> bounce(end - start);
      const std::span<uint8_t> all(bounce);
      TD_RETURN_IF_ERROR(ReadBlocks(start, all.first(min_block_)));
      if (end - min_block_ > start) {
        TD_RETURN_IF_ERROR(ReadBlocks(end - min_block_, all.last(min_block_)));
      }
      std::copy(buf.begin(), buf.end(), bounce.begin() + ptrdiff_t(offset - start));
      TD_RETURN_IF_ERROR(WriteBlocks(start, bounce));
    }
    bytes_written_ += buf.size();
    return Status::Ok();
  }

  Status Flush() override {
    if (read_only_ || !can_flush_) return Status::Ok();
    TD_ASSIGN_OR_RETURN(auto r, Issue([&](nbd_handle* h, nbd_completion_callback cb, Request*) {
                          return nbd_aio_flush(h, cb, 0);
                        }));
    std::vector<std::shared_ptr<Request>> one{r};
    return WaitAll(one, "flush", 0, 0);
  }

  Result<uint64_t> Size() override { return size_; }

  Status Resize(uint64_t size) override {
    if (size == size_) return Status::Ok();
    return Status::NotSupported(uri_ + ": an NBD export cannot be resized (its size is " +
                                std::to_string(size_) + " bytes)");
  }

  Status Allocate(uint64_t, uint64_t) override {
    return Status::NotSupported(uri_ + ": NBD exports cannot preallocate");
  }

  Status PunchHole(uint64_t offset, uint64_t length) override {
    return Zero(offset, length, /*keep_allocated=*/false);
  }

  Status ZeroRange(uint64_t offset, uint64_t length) override {
    TD_RETURN_IF_ERROR(Zero(offset, length, /*keep_allocated=*/true));
    bytes_written_ += length;
    return Status::Ok();
  }

  Result<uint64_t> NextData(uint64_t offset) override { return NextWhere(offset, false); }
  Result<uint64_t> NextHole(uint64_t offset) override { return NextWhere(offset, true); }

  Result<uint64_t> AllocatedBytes() override { return uint64_t{0}; }
  uint64_t bytes_written() const override { return bytes_written_.load(); }
  const std::string& name() const override { return uri_; }

 private:
  bool Aligned(uint64_t offset, uint64_t length) const {
    return offset % min_block_ == 0 && length % min_block_ == 0;
  }
  uint64_t AlignDown(uint64_t v) const { return v - v % min_block_; }
  uint64_t AlignUp(uint64_t v) const { return AlignDown(v + min_block_ - 1); }

  // READ of whole blocks (any range when the server has no minimum).
  Status ReadBlocks(uint64_t offset, std::span<uint8_t> buf) {
    // Past the end reads as zeros (the Storage contract's sparse tail).
    const uint64_t in = offset >= size_ ? 0 : std::min<uint64_t>(buf.size(), size_ - offset);
    std::fill(buf.begin() + ptrdiff_t(in), buf.end(), uint8_t{0});
    std::vector<std::shared_ptr<Request>> issued;
    Status s;
    for (uint64_t pos = 0; pos < in && s.ok(); pos += max_request_) {
      const uint64_t n = std::min(max_request_, in - pos);
      auto r = Issue([&](nbd_handle* h, nbd_completion_callback cb, Request*) {
        return nbd_aio_pread(h, buf.data() + pos, n, offset + pos, cb, 0);
      });
      if (r.has_value()) issued.push_back(std::move(r).value());
      else s = r.error();
    }
    Status w = WaitAll(issued, "read", offset, in);
    return s.ok() ? w : s;
  }

  // WRITE of whole blocks. REQUIRES: CheckWritable passed, rmw_mu_ held.
  Status WriteBlocks(uint64_t offset, std::span<const uint8_t> buf) {
    std::vector<std::shared_ptr<Request>> issued;
    Status s;
    for (uint64_t pos = 0; pos < buf.size() && s.ok(); pos += max_request_) {
      const uint64_t n = std::min<uint64_t>(max_request_, buf.size() - pos);
      auto r = Issue([&](nbd_handle* h, nbd_completion_callback cb, Request*) {
        return nbd_aio_pwrite(h, buf.data() + pos, n, offset + pos, cb, 0);
      });
      if (r.has_value()) issued.push_back(std::move(r).value());
      else s = r.error();
    }
    Status w = WaitAll(issued, "write", offset, buf.size());
    return s.ok() ? w : s;
  }

  static int OnExtents(void* user_data, const char* context, uint64_t offset, uint32_t* entries,
                       size_t count, int* /*error*/) {
    if (std::strcmp(context, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0) return 0;
    auto* r = static_cast<Request*>(user_data);
    if (!r->extents.empty()) return 0;  // a second reply: the first one suffices
    r->extents_from = offset;
    for (size_t i = 0; i + 1 < count; i += 2) r->extents.emplace_back(entries[i], entries[i + 1]);
    return 0;
  }

  // A background connection finished its handshake: used from now on if
  // the server shows it the same export as the first.
  bool Join(Connection& c) {
    nbd_handle* h = c.handle();
    const bool same = nbd_get_size(h) == int64_t(size_) && nbd_can_multi_conn(h) == 1 &&
                      (nbd_is_read_only(h) == 1) == server_read_only_ &&
                      (nbd_can_flush(h) == 1) == can_flush_ && (nbd_can_zero(h) == 1) == can_zero_ &&
                      (nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1) ==
                          have_allocation_ &&
                      std::max<int64_t>(nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM), 1) ==
                          int64_t(min_block_);
    if (!same) return false;
    std::lock_guard<std::mutex> lock(mu_);
    usable_.push_back(&c);
    return true;
  }

  // Opens the extra connections of a multi-conn export. They join when
  // their handshake is done; one that is refused, never answered or
  // differs from the first is simply not used.
  void StartExtraConnections() {
    for (size_t i = 1; i < kMaxConnections; ++i) {
      auto c = std::make_unique<Connection>(uri_, mu_);
      if (!c->ConnectInBackground([this](Connection& joined) { return Join(joined); }).ok()) break;
      conns_.push_back(std::move(c));
    }
  }

  // Issues one command on the next live connection (round robin), so
  // concurrent requests spread over all of them.
  template <typename Fn>
  Result<std::shared_ptr<Request>> Issue(Fn&& issue) {
    Connection* c = nullptr;
    bool start_extras = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (multi_conn_ && !extras_started_ && usable_.front()->in_flight() > 0) {
        extras_started_ = start_extras = true;
      }
      for (size_t i = 0; i < usable_.size() && c == nullptr; ++i) {
        Connection* next = usable_[next_++ % usable_.size()];
        if (next->dead().empty()) c = next;
      }
      if (c == nullptr) c = usable_.front();  // all dead: its error is the answer
    }
    if (start_extras) StartExtraConnections();
    return c->Issue([&](nbd_completion_callback cb, Request* r) -> int64_t {
      return issue(c->handle(), cb, r);
    });
  }

  // Waits for every issued request; the first failure is returned. A dead
  // connection ends the wait for its requests at once (they never complete).
  Status WaitAll(const std::vector<std::shared_ptr<Request>>& issued, const char* what,
                 uint64_t offset, uint64_t length) {
    std::unique_lock<std::mutex> lock(mu_);
    Status first;
    for (const auto& r : issued) {
      Connection& c = *r->conn;
      r->cv.wait(lock, [&] { return r->done || !c.dead().empty(); });
      if (!r->done) return DeadError(c);
      if (r->error == ENOTCONN) {
        // The connection died: libnbd fails the commands in flight first,
        // then the event loop records why; that reason is the better line.
        c.WaitDead(lock, std::chrono::seconds(1));
        if (!c.dead().empty()) return DeadError(c);
      }
      if (r->error != 0 && first.ok()) {
        first = Status(CodeForErrno(r->error),
                       uri_ + ": " + what + " of " + std::to_string(length) + " bytes at offset " +
                           std::to_string(offset) + " failed: " + std::strerror(r->error),
                       r->error);
      }
    }
    return first;
  }

  // REQUIRES: mu_ held and c.dead() set.
  Status DeadError(const Connection& c) const {
    return Status(Code::kIoError, uri_ + ": " + c.dead(), ENOTCONN);
  }

  Status CheckWritable(uint64_t offset, uint64_t length, const char* what) const {
    if (read_only_) return Status::ReadOnly(uri_ + ": the NBD export is read-only");
    if (offset > size_ || length > size_ - offset) {
      return Status(Code::kNoSpace,
                    uri_ + ": " + what + " of " + std::to_string(length) + " bytes at offset " +
                        std::to_string(offset) + " ends past the end of the export (" +
                        std::to_string(size_) + " bytes): the export is too small",
                    ENOSPC);
    }
    return Status::Ok();
  }

  Status Zero(uint64_t offset, uint64_t length, bool keep_allocated) {
    // Past the end already reads as zeros.
    if (offset >= size_) return Status::Ok();
    length = std::min(length, size_ - offset);
    TD_RETURN_IF_ERROR(CheckWritable(offset, length, "zero"));
    if (!Aligned(offset, length)) {
      // Partial blocks at either end are zero-filled writes (which
      // read-modify-write them); whole blocks between go to the server.
      const uint64_t end = offset + length;
      const uint64_t a = std::min(AlignUp(offset), end), b = std::max(AlignDown(end), a);
      std::vector<uint8_t> zeros(min_block_, 0);
      if (a > offset) TD_RETURN_IF_ERROR(WriteAt(offset, std::span(zeros).first(a - offset)));
      if (end > b) TD_RETURN_IF_ERROR(WriteAt(b, std::span(zeros).first(end - b)));
      bytes_written_ -= (a - offset) + (end - b);  // counted by ZeroRange, if at all
      return b > a ? Zero(a, b - a, keep_allocated) : Status::Ok();
    }
    if (!can_zero_) {
      std::vector<uint8_t> zeros(std::min(length, kZeroBufferBytes));
      for (uint64_t pos = 0; pos < length; pos += zeros.size()) {
        const uint64_t n = std::min<uint64_t>(zeros.size(), length - pos);
        TD_RETURN_IF_ERROR(WriteAt(offset + pos, std::span<const uint8_t>(zeros.data(), n)));
        bytes_written_ -= n;  // counted by the caller's ZeroRange, if at all
      }
      return Status::Ok();
    }
    const uint32_t flags = keep_allocated ? LIBNBD_CMD_FLAG_NO_HOLE : 0;
    std::shared_lock<std::shared_mutex> lock(rmw_mu_);
    std::vector<std::shared_ptr<Request>> issued;
    Status s;
    for (uint64_t pos = 0; pos < length && s.ok(); pos += kMaxRangeRequest) {
      const uint64_t n = std::min(kMaxRangeRequest, length - pos);
      auto r = Issue([&](nbd_handle* h, nbd_completion_callback cb, Request*) {
        return nbd_aio_zero(h, n, offset + pos, cb, flags);
      });
      if (r.has_value()) issued.push_back(std::move(r).value());
      else s = r.error();
    }
    Status w = WaitAll(issued, "write-zeroes", offset, length);
    return s.ok() ? w : s;
  }

  // The first offset >= `offset` that is a hole (want_hole) or data, by
  // base:allocation; Size() when there is none.
  Result<uint64_t> NextWhere(uint64_t offset, bool want_hole) {
    if (offset >= size_) return size_;
    if (!have_allocation_) return want_hole ? size_ : offset;
    while (offset < size_) {
      // Queries start on a block boundary; extents before `offset` are
      // skipped below.
      const uint64_t query = AlignDown(offset);
      const uint64_t n = std::min(kMaxRangeRequest, size_ - query);
      // The extent callback writes into the Request, which the completion's
      // Holder keeps alive until after both callbacks are done. REQ_ONE:
      // only the extent at `query` (as qemu's client asks), so the server
      // need not map the whole range ahead (nbdkit's file plugin walks it
      // with SEEK_DATA/SEEK_HOLE: a 1 GiB query of a fragmented file cost
      // more than the reads it saved).
      TD_ASSIGN_OR_RETURN(auto r, Issue([&](nbd_handle* h, nbd_completion_callback cb,
                                            Request* req) {
                            nbd_extent_callback ext{&OnExtents, req, nullptr};
                            return nbd_aio_block_status(h, n, query, ext, cb,
                                                        LIBNBD_CMD_FLAG_REQ_ONE);
                          }));
      std::vector<std::shared_ptr<Request>> one{r};
      TD_RETURN_IF_ERROR(WaitAll(one, "block status", offset, n));
      // Only the issuing thread reads the extents, after the completion.
      if (r->extents.empty() || r->extents_from != query) {
        return Status(Code::kIoError, uri_ + ": the server sent no base:allocation extents at offset " +
                                          std::to_string(offset));
      }
      uint64_t pos = query;
      for (const auto& [length, flags] : r->extents) {
        if (length == 0) {
          return Status(Code::kIoError, uri_ + ": the server sent an empty extent at offset " +
                                            std::to_string(offset));
        }
        const bool hole = (flags & LIBNBD_STATE_HOLE) != 0;
        const uint64_t extent_end = pos + length;
        if (extent_end > offset && hole == want_hole) return std::min(std::max(pos, offset), size_);
        pos = extent_end;
        if (pos >= size_) break;
      }
      if (pos <= offset) {
        return Status(Code::kIoError, uri_ + ": the server's block status made no progress at " +
                                          "offset " + std::to_string(offset));
      }
      offset = pos;
    }
    return size_;
  }

  std::string uri_;
  bool read_only_;
  // Fixed once connected.
  bool server_read_only_ = false;
  uint64_t size_ = 0;
  uint64_t max_request_ = kDefaultMaxRequest;
  uint64_t min_block_ = 1;  // the server's minimum block size (a power of 2)
  bool can_flush_ = false;
  bool can_zero_ = false;
  bool have_allocation_ = false;
  bool multi_conn_ = false;
  std::atomic<uint64_t> bytes_written_{0};

  // Writes of whole blocks share it; a read-modify-write of partial blocks
  // holds it alone.
  std::shared_mutex rmw_mu_;

  // Guards every Request and connection state, and the two below.
  std::mutex mu_;
  std::vector<Connection*> usable_;  // connections with a finished handshake; [0] the first
  size_t next_ = 0;                  // round robin over usable_
  bool extras_started_ = false;      // StartExtraConnections called
  // Last, so they are destroyed (their loops stopped) first. Grown only
  // by Connect and the one StartExtraConnections call.
  std::vector<std::unique_ptr<Connection>> conns_;
};

}  // namespace

Result<std::unique_ptr<io::Storage>> OpenNbd(const std::string& uri, bool read_only) {
  auto storage = std::make_unique<NbdStorage>(uri, read_only);
  TD_RETURN_IF_ERROR(storage->Connect());
  return std::unique_ptr<io::Storage>(std::move(storage));
}

}  // namespace thindisk::nbdclient
