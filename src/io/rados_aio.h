// RunAio: a batch of asynchronous librados operations, run a window at a
// time, for io::RadosStorage (internal to io/).
//
// Why windows: a 1 GiB request on 4 MiB objects is 256 operations; sending
// them all at once would queue them in the client for no gain and hold a
// completion each. kWindow bounds what one call has in flight.
//
// Every launched operation is waited for, even after one fails: the
// buffers they read into or write from belong to the caller, who may free
// them as soon as RunAio returns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <rados/librados.hpp>
#include <vector>

#include "util/status.h"

namespace thindisk::io::rados_internal {

// What one operation of a batch may need to keep alive until it completes.
struct AioSlot {
  librados::AioCompletion* completion = nullptr;
  librados::bufferlist bl;
  std::optional<librados::ObjectWriteOperation> op;
  uint64_t stat_size = 0;
  time_t stat_mtime = 0;

  void Reset() {
    bl.clear();
    op.reset();
    stat_size = 0;
    stat_mtime = 0;
  }
};

// For i in [0, n): launch(i, slot) starts operation i on slot.completion
// and returns librados' immediate result (< 0: it was not started); then
// finish(i, slot, ret) turns its result into a Status. Returns the first
// error; after one, no further window is launched.
template <typename Launch, typename Finish>
Status RunAio(uint64_t n, size_t window, Launch&& launch, Finish&& finish) {
  if (n == 0) return Status::Ok();
  std::vector<AioSlot> slots(std::min<uint64_t>(n, window));
  Status first;
  for (uint64_t base = 0; base < n && first.ok(); base += slots.size()) {
    const uint64_t count = std::min<uint64_t>(slots.size(), n - base);
    uint64_t launched = 0;
    for (; launched < count; ++launched) {
      AioSlot& s = slots[launched];
      s.Reset();
      s.completion = librados::Rados::aio_create_completion();
      const int ret = launch(base + launched, s);
      if (ret < 0) {
        s.completion->release();
        s.completion = nullptr;
        first = finish(base + launched, s, ret);
        if (first.ok()) continue;  // the caller accepts this failure (e.g. ENOENT)
        break;
      }
    }
    for (uint64_t j = 0; j < launched; ++j) {
      AioSlot& s = slots[j];
      if (s.completion == nullptr) continue;
      s.completion->wait_for_complete();
      const int ret = s.completion->get_return_value();
      s.completion->release();
      s.completion = nullptr;
      Status st = finish(base + j, s, ret);
      if (first.ok() && !st.ok()) first = std::move(st);
    }
  }
  return first;
}

}  // namespace thindisk::io::rados_internal
