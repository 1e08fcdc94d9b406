// nbdclient::Pipeline on libnbd's asynchronous calls (nbdclient/pipeline.h).
#include "nbdclient/pipeline.h"

#include <libnbd.h>

#include <chrono>
#include <string>
#include <utility>

#include "nbdclient/connection.h"  // LibnbdError

namespace thindisk::nbdclient {
namespace {

using Clock = std::chrono::steady_clock;

class LibnbdPipeline final : public Pipeline {
 public:
  explicit LibnbdPipeline(nbd_handle* h) : h_(h) {}
  ~LibnbdPipeline() override {
    nbd_shutdown(h_, 0);
    nbd_close(h_);
  }

  Status Open(const std::string& uri) {
    // nbds:// URIs name their credentials as local files (tls-certificates=,
    // tls-psk-file=); the URI is the user's own.
    if (nbd_set_uri_allow_local_file(h_, true) == -1) return LibnbdError(uri);
    if (nbd_connect_uri(h_, uri.c_str()) == -1) return LibnbdError(uri);
    const int64_t size = nbd_get_size(h_);
    if (size < 0) return LibnbdError(uri + ": export size");
    size_ = uint64_t(size);
    read_only_ = nbd_is_read_only(h_) == 1;
    can_flush_ = nbd_can_flush(h_) == 1;
    return Status::Ok();
  }

  uint64_t size() const override { return size_; }
  bool read_only() const override { return read_only_; }
  bool can_flush() const override { return can_flush_; }

  Status Run(bool writes, std::vector<std::vector<uint8_t>>& buffers,
             const Calls& calls) override;

  Status Flush() override {
    if (!can_flush_) return Status::NotSupported("the export does not take flushes");
    if (nbd_flush(h_, 0) == -1) return LibnbdError("flush");
    return Status::Ok();
  }

 private:
  // One buffer and the request in it; completed by nbd_poll on the
  // running thread.
  struct Slot {
    LibnbdPipeline* owner = nullptr;
    std::vector<uint8_t>* buf = nullptr;
    PipelineRequest request;
    Clock::time_point start;
  };

  static int Completed(void* user_data, int* error) {
    auto* slot = static_cast<Slot*>(user_data);
    LibnbdPipeline& p = *slot->owner;
    if (*error != 0) {
      if (p.error_ == 0) p.error_ = *error;
    } else {
      const auto nanos =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - slot->start);
      (*p.done_)(slot->request, uint64_t(nanos.count()));
    }
    p.free_.push_back(slot);
    return 1;  // retire the command
  }

  nbd_handle* h_;
  uint64_t size_ = 0;
  bool read_only_ = false;
  bool can_flush_ = false;
  // While Run runs: free slots, the first failed request's errno, and
  // where completions are reported.
  std::vector<Slot*> free_;
  int error_ = 0;
  const std::function<void(const PipelineRequest&, uint64_t)>* done_ = nullptr;
};

Status LibnbdPipeline::Run(bool writes, std::vector<std::vector<uint8_t>>& buffers,
                           const Calls& calls) {
  if (buffers.empty()) return Status::InvalidArgument("a pipeline needs at least one buffer");
  std::vector<Slot> slots(buffers.size());
  free_.clear();
  for (size_t i = 0; i < slots.size(); ++i) {
    slots[i].owner = this;
    slots[i].buf = &buffers[i];
    free_.push_back(&slots[i]);
  }
  error_ = 0;
  done_ = &calls.done;
  Clock::time_point last_tick = Clock::now();
  bool more = true;
  Status error;
  while (error.ok()) {
    while (!free_.empty() && more && error_ == 0) {
      Slot* slot = free_.back();
      if (!calls.next(slot->request)) {
        more = false;
        break;
      }
      const PipelineRequest& r = slot->request;
      if (r.length > slot->buf->size()) {
        error = Status::InvalidArgument("a request of " + std::to_string(r.length) +
                                        " bytes in a buffer of " +
                                        std::to_string(slot->buf->size()));
        break;
      }
      free_.pop_back();
      slot->start = Clock::now();
      nbd_completion_callback cb = {Completed, slot, nullptr};
      const int64_t cookie =
          writes ? nbd_aio_pwrite(h_, slot->buf->data(), r.length, r.offset, cb, 0)
                 : nbd_aio_pread(h_, slot->buf->data(), r.length, r.offset, cb, 0);
      if (cookie == -1) {
        error = LibnbdError("request at offset " + std::to_string(r.offset));
        free_.push_back(slot);
        break;
      }
    }
    if (error_ != 0 && error.ok()) error = Status::FromErrno(error_, "NBD request failed");
    if (free_.size() == slots.size() && (!more || !error.ok())) break;
    if (nbd_poll(h_, 100) == -1 && error.ok()) error = LibnbdError("nbd_poll");
    if (calls.tick && Clock::now() - last_tick > std::chrono::milliseconds(100)) {
      last_tick = Clock::now();
      calls.tick();
    }
  }
  // Drain whatever is still in flight after an error before the slots go away.
  while (free_.size() < slots.size() && nbd_poll(h_, 1000) != -1) {
  }
  done_ = nullptr;
  return error;
}

}  // namespace

Result<std::unique_ptr<Pipeline>> OpenPipeline(const std::string& uri) {
  nbd_handle* h = nbd_create();
  if (h == nullptr) return LibnbdError("nbd_create");
  auto p = std::make_unique<LibnbdPipeline>(h);
  TD_RETURN_IF_ERROR(p->Open(uri));
  return std::unique_ptr<Pipeline>(std::move(p));
}

}  // namespace thindisk::nbdclient
