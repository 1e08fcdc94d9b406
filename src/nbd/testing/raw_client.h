// RawClient: a byte-level NBD client for tests of the server.
//
// It speaks just enough of the protocol to drive the server through every
// path, including the ones a polite client never takes (bad magic, oversize
// lengths, requests past the end, vanishing mid-request). Reads time out
// after a few seconds (SO_RCVTIMEO) so a broken server fails a test instead
// of hanging it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "util/result.h"

namespace thindisk::nbd::testing {

class RawClient {
 public:
  // Takes ownership of `fd` (a connected socket).
  explicit RawClient(int fd, int timeout_ms = 5000);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  static Result<std::unique_ptr<RawClient>> ConnectUnix(const std::string& path);

  int fd() const { return fd_; }

  // ---- Handshake ----
  Result<uint16_t> ReadGreeting();  // handshake flags
  Status SendClientFlags(uint32_t flags);
  Status SendOption(uint32_t code, std::span<const uint8_t> data = {});
  // Sends an option header claiming `length` bytes but no payload.
  Status SendOptionHeader(uint32_t code, uint32_t length);
  struct OptionReply {
    uint32_t option = 0;
    uint32_t type = 0;
    std::vector<uint8_t> data;
  };
  Result<OptionReply> ReadOptionReply();
  // Greeting, client flags (fixed newstyle + no zeroes), optionally
  // STRUCTURED_REPLY and SET_META_CONTEXT(contexts), then GO(name).
  struct Negotiated {
    uint64_t size = 0;
    uint16_t flags = 0;
  };
  Result<Negotiated> Handshake(const std::string& name, bool structured,
                               const std::vector<std::string>& contexts = {});

  // ---- Transmission ----
  Status SendRequest(uint16_t flags, uint16_t type, uint64_t handle, uint64_t offset,
                     uint32_t length, std::span<const uint8_t> payload = {});
  Status SendBytes(std::span<const uint8_t> bytes);
  // A request's bytes, for a test that sends several in one write.
  static std::vector<uint8_t> EncodeRequest(uint16_t flags, uint16_t type,
                                            uint64_t handle, uint64_t offset,
                                            uint32_t length,
                                            std::span<const uint8_t> payload = {});
  // One simple reply or one structured chunk. For a simple reply with no
  // error, `simple_read_length` bytes of data are read into payload.
  struct Reply {
    bool structured = false;
    uint16_t flags = 0;  // chunk flags
    uint16_t type = 0;   // chunk type
    uint64_t handle = 0;
    uint32_t error = 0;  // simple reply error, or error chunk's error
    std::vector<uint8_t> payload;
  };
  Result<Reply> ReadReply(uint32_t simple_read_length = 0);
  // Reads a structured READ reply until DONE, reassembling OFFSET_DATA and
  // OFFSET_HOLE chunks into `out` (sized to the request). Returns the error
  // of an error chunk, 0 on success; counts holes in *holes if given.
  Result<uint32_t> ReadStructuredRead(uint64_t offset, std::vector<uint8_t>* out,
                                      int* holes = nullptr, int* chunks = nullptr);

  // True when the server closed the connection (EOF or reset) within the timeout.
  bool ServerClosed();

 private:
  Status Read(std::span<uint8_t> buf);
  int fd_;
};

// Option payload builders.
std::vector<uint8_t> GoData(const std::string& name,
                            const std::vector<uint16_t>& requests = {});
std::vector<uint8_t> MetaContextData(const std::string& name,
                                     const std::vector<std::string>& queries);

}  // namespace thindisk::nbd::testing
