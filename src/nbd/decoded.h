// Decoded<T>: the answer of an incremental decoder.
//
// The NBD codec never reads a socket: it is handed the bytes received so far
// and answers either "a whole message, which used `consumed` bytes" or "need
// more: come back with at least `need` bytes". Framing errors (bad magic, a
// length beyond a limit) are returned as a Status by the decoder instead;
// they end the session, because the byte stream can no longer be trusted.
#pragma once

#include <cstddef>
#include <optional>

namespace thindisk::nbd {

template <typename T>
struct Decoded {
  std::optional<T> message;  // set when a whole message was decoded
  size_t consumed = 0;       // bytes of input it used (when message is set)
  size_t need = 0;           // total input bytes required (when it is not)

  bool complete() const { return message.has_value(); }

  static Decoded NeedMore(size_t total) {
    Decoded d;
    d.need = total;
    return d;
  }
  static Decoded Done(T value, size_t used) {
    Decoded d;
    d.message = std::move(value);
    d.consumed = used;
    return d;
  }
};

}  // namespace thindisk::nbd
