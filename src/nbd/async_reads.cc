#include "nbd/async_reads.h"

#include <liburing.h>

#include <cerrno>
#include <utility>
#include <vector>

namespace thindisk::nbd {
namespace {

class RingReads final : public AsyncReads {
 public:
  ~RingReads() override {
    // The connection reaps everything before it goes (pending() == 0);
    // a ring torn down with reads in flight cancels them.
    io_uring_queue_exit(&ring_);
  }

  bool Init(unsigned entries) { return io_uring_queue_init(entries, &ring_, 0) == 0; }

  void Add(std::span<const HostRead> reads, Done done) override {
    auto op = std::make_shared<Op>();
    op->done = std::move(done);
    op->left = reads.size();
    ++pending_;
    if (reads.empty()) return Finish(op);
    for (const HostRead& r : reads) {
      const int fd = r.storage->ReadFdFor(r.offset, r.dst);
      auto* piece = new Piece{op, r, fd != r.storage->ReadFd()};
      io_uring_sqe* sqe = fd < 0 ? nullptr : NextSqe();
      if (sqe == nullptr) {  // no descriptor, or no ring: read it here
        Complete(piece, -EAGAIN);
        continue;
      }
      io_uring_prep_read(sqe, fd, r.dst.data(), unsigned(r.dst.size()), r.offset);
      io_uring_sqe_set_data(sqe, piece);
      queued_.push_back(piece);
    }
  }

  Status Submit() override {
    for (int tries = 0; !queued_.empty(); ++tries) {
      int n = io_uring_submit(&ring_);
      if ((n == -EINTR || n == -EAGAIN || n == -EBUSY || n == 0) && tries < 1000) {
        Reap(1);  // room for completions, then try again
        continue;
      }
      if (n <= 0) {
        // The ring cannot take them: read what it holds here, so every
        // READ still finishes, and never submit again (the ring still
        // holds their entries).
        broken_ = true;
        Status s = Status::FromErrno(n < 0 ? -n : EAGAIN, "io_uring_submit");
        std::vector<Piece*> left;
        left.swap(queued_);
        for (Piece* piece : left) Complete(piece, -EAGAIN);
        return s;
      }
      // The kernel takes submissions in order.
      queued_.erase(queued_.begin(),
                    queued_.begin() + std::min<size_t>(queued_.size(), size_t(n)));
    }
    return Status::Ok();
  }

  void Reap(int wait_ms) override {
    io_uring_cqe* cqe = nullptr;
    if (wait_ms > 0 && pending_ > 0) {
      __kernel_timespec ts{wait_ms / 1000, (wait_ms % 1000) * 1000000LL};
      (void)io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
    }
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      Complete(static_cast<Piece*>(io_uring_cqe_get_data(cqe)), cqe->res);
    }
    io_uring_cq_advance(&ring_, seen);
  }

  int fd() const override { return ring_.ring_fd; }
  size_t pending() const override { return pending_; }

 private:
  struct Op {
    Done done;
    size_t left = 0;
    Status status;
  };
  struct Piece {
    std::shared_ptr<Op> op;
    HostRead read;
    bool direct;  // through the storage's O_DIRECT descriptor (ReadFdFor)
  };

  // A free submission entry (submitting the full queue first when there
  // is none); null once the ring has failed.
  io_uring_sqe* NextSqe() {
    if (broken_) return nullptr;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe != nullptr) return sqe;
    (void)Submit();
    return broken_ ? nullptr : io_uring_get_sqe(&ring_);
  }

  void Complete(Piece* piece, int res) {
    std::unique_ptr<Piece> owned(piece);
    const HostRead& r = piece->read;
    Status s;
    if (res == -EAGAIN || res == -EINTR || (res == -EINVAL && piece->direct)) {
      s = r.storage->ReadAt(r.offset, r.dst);
    } else if (res < 0) {
      s = Status::FromErrno(-res, r.storage->name() + ": read");
    } else if (size_t(res) < r.dst.size()) {
      s = r.storage->ReadAt(r.offset + size_t(res), r.dst.subspan(size_t(res)));
    }
    Op& op = *piece->op;
    if (!s.ok() && op.status.ok()) op.status = s;
    if (--op.left == 0) Finish(piece->op);
  }

  void Finish(const std::shared_ptr<Op>& op) {
    --pending_;
    Done done = std::move(op->done);
    done(op->status);
  }

  io_uring ring_{};
  std::vector<Piece*> queued_;  // prepared, not yet submitted, in order
  bool broken_ = false;         // a submission failed: Add reads with pread
  size_t pending_ = 0;          // READs not done
};

}  // namespace

std::unique_ptr<AsyncReads> AsyncReads::Create(unsigned entries) {
  auto r = std::make_unique<RingReads>();
  if (!r->Init(entries)) return nullptr;
  return r;
}

}  // namespace thindisk::nbd
