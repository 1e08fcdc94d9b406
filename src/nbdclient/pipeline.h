// nbdclient::Pipeline: one connection to an NBD export that keeps a set
// number of requests in flight from one thread, as a benchmark drives a
// server (`thindisk bench --uri`): each completion issues the next request
// at once, so the server always has `depth` requests to work on.
//
// Unlike NbdStorage (nbdclient/nbd_storage.h), which serves many threads
// that each wait for their own request, the caller's thread does all the
// work here: it issues with libnbd's nbd_aio_* calls and completes with
// nbd_poll, so nothing is locked or handed between threads, and a
// request's latency is the server's and the socket's.
//
// It lives in the NBD client module (nbdclient/nbd_module.h): the binary
// calls nbd_module::OpenPipeline.
//
// Thread safety: one thread at a time per Pipeline.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "util/result.h"

namespace thindisk::nbdclient {

struct PipelineRequest {
  uint64_t offset = 0;
  uint32_t length = 0;
};

class Pipeline {
 public:
  struct Calls {
    // Fills in the next request to issue; false when there is none (all
    // issued, or out of time). Not called again after an error.
    std::function<bool(PipelineRequest&)> next;
    // A request completed without error, `nanos` after it was issued.
    std::function<void(const PipelineRequest&, uint64_t nanos)> done;
    // While requests run, called about every 100 ms (progress); may be empty.
    std::function<void()> tick;
  };

  virtual ~Pipeline() = default;

  // The export's size, and what it offers.
  virtual uint64_t size() const = 0;
  virtual bool read_only() const = 0;
  virtual bool can_flush() const = 0;

  // Issues the requests `calls.next` gives, writes (NBD_CMD_WRITE of the
  // buffer's first `length` bytes) or reads (into it), with up to
  // buffers.size() in flight, each request in a buffer of its own, until
  // next() says there are no more and every one has completed. Every
  // buffer must hold the longest request. The first error stops the
  // issuing; what is in flight is drained before it is returned.
  virtual Status Run(bool writes, std::vector<std::vector<uint8_t>>& buffers,
                     const Calls& calls) = 0;

  // NBD_CMD_FLUSH (kNotSupported unless can_flush()).
  virtual Status Flush() = 0;
};

// Connects to the export `uri` (nbd://, nbd+unix://, nbds...: libnbd's
// URIs, nbdclient/nbd_uri.h; the credential files an nbds:// URI names,
// tls-certificates= and tls-psk-file=, are read).
Result<std::unique_ptr<Pipeline>> OpenPipeline(const std::string& uri);

}  // namespace thindisk::nbdclient
