#include "nbd/testing/raw_client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "nbd/fd_io.h"
#include "nbd/protocol.h"
#include "util/endian.h"

namespace thindisk::nbd::testing {
namespace {

void Put32(std::vector<uint8_t>* b, uint32_t v) {
  uint8_t x[4];
  StoreBe32(x, v);
  b->insert(b->end(), x, x + 4);
}
void Put16(std::vector<uint8_t>* b, uint16_t v) {
  uint8_t x[2];
  StoreBe16(x, v);
  b->insert(b->end(), x, x + 2);
}
void PutStr(std::vector<uint8_t>* b, const std::string& s) {
  b->insert(b->end(), s.begin(), s.end());
}

}  // namespace

std::vector<uint8_t> GoData(const std::string& name,
                            const std::vector<uint16_t>& requests) {
  std::vector<uint8_t> d;
  Put32(&d, uint32_t(name.size()));
  PutStr(&d, name);
  Put16(&d, uint16_t(requests.size()));
  for (uint16_t r : requests) Put16(&d, r);
  return d;
}

std::vector<uint8_t> MetaContextData(const std::string& name,
                                     const std::vector<std::string>& queries) {
  std::vector<uint8_t> d;
  Put32(&d, uint32_t(name.size()));
  PutStr(&d, name);
  Put32(&d, uint32_t(queries.size()));
  for (const auto& q : queries) {
    Put32(&d, uint32_t(q.size()));
    PutStr(&d, q);
  }
  return d;
}

RawClient::RawClient(int fd, int timeout_ms) : fd_(fd) {
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

RawClient::~RawClient() { close(fd_); }

Result<std::unique_ptr<RawClient>> RawClient::ConnectUnix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) {
    int e = errno;
    close(fd);
    return Status::FromErrno(e, "connect " + path);
  }
  return std::make_unique<RawClient>(fd);
}

Status RawClient::Read(std::span<uint8_t> buf) { return ReadExact(fd_, buf); }

Status RawClient::SendBytes(std::span<const uint8_t> bytes) {
  return WriteAll(fd_, bytes);
}

Result<uint16_t> RawClient::ReadGreeting() {
  uint8_t g[kGreetingSize];
  TD_RETURN_IF_ERROR(Read(g));
  if (LoadBe64(g) != kInitPasswd || LoadBe64(g + 8) != kIHaveOpt)
    return Status::Corrupt("bad greeting");
  return LoadBe16(g + 16);
}

Status RawClient::SendClientFlags(uint32_t flags) {
  uint8_t b[4];
  StoreBe32(b, flags);
  return SendBytes(b);
}

Status RawClient::SendOptionHeader(uint32_t code, uint32_t length) {
  uint8_t h[kOptionHeaderSize];
  StoreBe64(h, kIHaveOpt);
  StoreBe32(h + 8, code);
  StoreBe32(h + 12, length);
  return SendBytes(h);
}

Status RawClient::SendOption(uint32_t code, std::span<const uint8_t> data) {
  TD_RETURN_IF_ERROR(SendOptionHeader(code, uint32_t(data.size())));
  return SendBytes(data);
}

Result<RawClient::OptionReply> RawClient::ReadOptionReply() {
  uint8_t h[kOptionReplyHeaderSize];
  TD_RETURN_IF_ERROR(Read(h));
  if (LoadBe64(h) != kOptReplyMagic) return Status::Corrupt("bad option reply magic");
  OptionReply r;
  r.option = LoadBe32(h + 8);
  r.type = LoadBe32(h + 12);
  r.data.resize(LoadBe32(h + 16));
  TD_RETURN_IF_ERROR(Read(r.data));
  return r;
}

Result<RawClient::Negotiated> RawClient::Handshake(
    const std::string& name, bool structured, const std::vector<std::string>& contexts) {
  TD_ASSIGN_OR_RETURN(uint16_t flags, ReadGreeting());
  (void)flags;
  TD_RETURN_IF_ERROR(SendClientFlags(kFlagCFixedNewstyle | kFlagCNoZeroes));
  if (structured) {
    TD_RETURN_IF_ERROR(SendOption(kOptStructuredReply));
    TD_ASSIGN_OR_RETURN(OptionReply r, ReadOptionReply());
    if (r.type != kRepAck) return Status::NotSupported("no structured replies");
  }
  if (!contexts.empty()) {
    TD_RETURN_IF_ERROR(SendOption(kOptSetMetaContext, MetaContextData(name, contexts)));
    for (;;) {
      TD_ASSIGN_OR_RETURN(OptionReply r, ReadOptionReply());
      if (r.type == kRepAck) break;
      if (r.type != kRepMetaContext)
        return Status::NotSupported("SET_META_CONTEXT failed");
    }
  }
  TD_RETURN_IF_ERROR(SendOption(kOptGo, GoData(name)));
  Negotiated n;
  for (;;) {
    TD_ASSIGN_OR_RETURN(OptionReply r, ReadOptionReply());
    if (r.type == kRepAck) break;
    if (r.type != kRepInfo)
      return Status::NotFound("GO failed with reply " + std::to_string(r.type));
    if (r.data.size() == 12 && LoadBe16(r.data.data()) == kInfoExport) {
      n.size = LoadBe64(r.data.data() + 2);
      n.flags = LoadBe16(r.data.data() + 10);
    }
  }
  return n;
}

std::vector<uint8_t> RawClient::EncodeRequest(uint16_t flags, uint16_t type,
                                              uint64_t handle, uint64_t offset,
                                              uint32_t length,
                                              std::span<const uint8_t> payload) {
  std::vector<uint8_t> b(kRequestHeaderSize + payload.size());
  StoreBe32(b.data(), kRequestMagic);
  StoreBe16(b.data() + 4, flags);
  StoreBe16(b.data() + 6, type);
  StoreBe64(b.data() + 8, handle);
  StoreBe64(b.data() + 16, offset);
  StoreBe32(b.data() + 24, length);
  std::copy(payload.begin(), payload.end(), b.begin() + kRequestHeaderSize);
  return b;
}

Status RawClient::SendRequest(uint16_t flags, uint16_t type, uint64_t handle,
                              uint64_t offset, uint32_t length,
                              std::span<const uint8_t> payload) {
  return SendBytes(EncodeRequest(flags, type, handle, offset, length, payload));
}

Result<RawClient::Reply> RawClient::ReadReply(uint32_t simple_read_length) {
  uint8_t magic[4];
  TD_RETURN_IF_ERROR(Read(magic));
  Reply r;
  if (LoadBe32(magic) == kSimpleReplyMagic) {
    uint8_t h[12];
    TD_RETURN_IF_ERROR(Read(h));
    r.error = LoadBe32(h);
    r.handle = LoadBe64(h + 4);
    if (r.error == 0 && simple_read_length) {
      r.payload.resize(simple_read_length);
      TD_RETURN_IF_ERROR(Read(r.payload));
    }
    return r;
  }
  if (LoadBe32(magic) != kStructuredReplyMagic) return Status::Corrupt("bad reply magic");
  uint8_t h[16];
  TD_RETURN_IF_ERROR(Read(h));
  r.structured = true;
  r.flags = LoadBe16(h);
  r.type = LoadBe16(h + 2);
  r.handle = LoadBe64(h + 4);
  r.payload.resize(LoadBe32(h + 12));
  TD_RETURN_IF_ERROR(Read(r.payload));
  if ((r.type & 0x8000) && r.payload.size() >= 4) r.error = LoadBe32(r.payload.data());
  return r;
}

Result<uint32_t> RawClient::ReadStructuredRead(uint64_t offset, std::vector<uint8_t>* out,
                                               int* holes, int* chunks) {
  uint32_t error = 0;
  for (;;) {
    TD_ASSIGN_OR_RETURN(Reply r, ReadReply());
    if (!r.structured) return Status::Corrupt("simple reply to a structured read");
    if (chunks) ++*chunks;
    if (r.type == kReplyTypeOffsetData) {
      const uint64_t at = LoadBe64(r.payload.data()) - offset;
      if (at + r.payload.size() - 8 > out->size())
        return Status::Corrupt("data outside request");
      std::copy(r.payload.begin() + 8, r.payload.end(), out->begin() + at);
    } else if (r.type == kReplyTypeOffsetHole) {
      const uint64_t at = LoadBe64(r.payload.data()) - offset;
      const uint32_t len = LoadBe32(r.payload.data() + 8);
      if (at + len > out->size()) return Status::Corrupt("hole outside request");
      std::fill_n(out->begin() + at, len, 0);
      if (holes) ++*holes;
    } else if (r.type & 0x8000) {
      error = r.error;
    }
    if (r.flags & kReplyFlagDone) return error;
  }
}

bool RawClient::ServerClosed() {
  uint8_t b;
  for (;;) {
    ssize_t n = recv(fd_, &b, 1, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET || errno == EPIPE;
    // Discard anything the server still had to say.
  }
}

}  // namespace thindisk::nbd::testing
