/* hostile_scale_client: hostile NBD clients at scale against a running
 * `thindisk serve` on a Unix socket, plus the well-behaved client that
 * must keep working meanwhile. One mode per process; hostile_scale.sh runs
 * them side by side. Hostile modes speak raw NBD over the socket so they
 * can stop at any byte; the good client uses libnbd.
 *
 *   good URI REGION_BYTES STOP_FILE MAX_SECONDS
 *       Random writes, zeroes, flushes and reads in [0, REGION_BYTES) of a
 *       fresh (all-zero) export, every read checked against its model,
 *       until STOP_FILE exists; then re-reads the region. Fails on any
 *       error, mismatch, or one request taking longer than 30 s. Creates
 *       STOP_FILE.ready once connected. Prints "good: N ops, max M ms".
 *   churn SOCKET COUNT SCRATCH_OFFSET
 *       COUNT connections, each dropped at one of 12 points in turn: before
 *       or inside the greeting, mid client flags, mid option header, mid
 *       option payload, after GO, mid request header, mid WRITE payload
 *       (at SCRATCH_OFFSET), with 16 READ replies unread, after a bad
 *       magic, after garbage, and a clean NBD_CMD_DISC.
 *   slow SOCKET CONNS READS LENGTH STOP_FILE
 *       CONNS connections (simple replies, so the server must buffer the
 *       data) each sending READS reads of LENGTH bytes and never reading a
 *       reply, held open until STOP_FILE exists.
 *   options SOCKET COUNT EXPECTED_LIMIT
 *       Sends up to COUNT options (LIST, INFO, unknown, LIST_META_CONTEXT
 *       in turn), each answered before the next; expects exactly
 *       EXPECTED_LIMIT normal answers, then NBD_REP_ERR_POLICY and EOF.
 *   flood SOCKET COUNT
 *       Writes COUNT options without reading any reply, then hangs up.
 *   lengths SOCKET EXPORT_SIZE SCRATCH_OFFSET
 *       READ and WRITE requests of every interesting length up to and past
 *       the 32 MiB maximum payload, TRIM/WRITE_ZEROES up to the export
 *       size and past it, absurd offsets and lengths, an unknown command;
 *       checks each exact error (or success) and that the stream stays in
 *       sync; ends with a WRITE header promising 4 GiB and a hang-up.
 * Exit 0 when every check passes. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libnbd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "test_client.h"

#define kMaxPayload (32u << 20) /* src/nbd/protocol.h kMaxPayloadLength */
#define kOptGo 7
#define kOptList 3
#define kOptInfo 6
#define kOptListMetaContext 9
#define kRepAck 1
#define kRepInfo 3
#define kRepErrPolicy (0x80000000u | 2)
#define kCmdRead 0
#define kCmdWrite 1
#define kCmdDisc 2
#define kCmdTrim 4
#define kCmdWriteZeroes 6

/* ---- raw protocol helpers ---- */

static void Put16(unsigned char* p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
static void Put32(unsigned char* p, uint32_t v) { Put16(p, v >> 16); Put16(p + 2, v); }
static void Put64(unsigned char* p, uint64_t v) { Put32(p, v >> 32); Put32(p + 4, v); }
static uint32_t Get32(const unsigned char* p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint64_t Get64(const unsigned char* p) { return (uint64_t)Get32(p) << 32 | Get32(p + 4); }

static int Dial(const char* path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof a) != 0) {
    fprintf(stderr, "connect %s: %s\n", path, strerror(errno));
    exit(1);
  }
  return fd;
}

static int ReadFull(int fd, void* buf, size_t n) {
  unsigned char* p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int WriteFull(int fd, const void* buf, size_t n) {
  const unsigned char* p = buf;
  while (n > 0) {
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Reads the 18-byte greeting (all of it, or only `upto` bytes). */
static int Greeting(int fd, size_t upto) {
  unsigned char g[18];
  if (upto > sizeof g) upto = sizeof g;
  if (ReadFull(fd, g, upto) != 0) return -1;
  if (upto == sizeof g && (memcmp(g, "NBDMAGICIHAVEOPT", 16) != 0 || !(g[17] & 1))) return -1;
  return 0;
}

/* Greeting, then client flags FIXED_NEWSTYLE | NO_ZEROES. */
static int Hello(int fd) {
  unsigned char flags[4];
  Put32(flags, 3);
  return Greeting(fd, 18) == 0 ? WriteFull(fd, flags, 4) : -1;
}

static void OptionHeader(unsigned char* h, uint32_t code, uint32_t len) {
  memcpy(h, "IHAVEOPT", 8);
  Put32(h + 8, code);
  Put32(h + 12, len);
}

static int SendOption(int fd, uint32_t code, const void* data, uint32_t len) {
  unsigned char h[16];
  OptionHeader(h, code, len);
  return WriteFull(fd, h, 16) == 0 && WriteFull(fd, data, len) == 0 ? 0 : -1;
}

/* One option reply: its type, and its payload in buf (at most cap bytes
 * kept). Returns -1 on EOF or a bad reply magic. */
static int OptionReply(int fd, uint32_t* type, unsigned char* buf, size_t cap, uint32_t* len) {
  unsigned char h[20];
  if (ReadFull(fd, h, 20) != 0 || Get64(h) != UINT64_C(0x3e889045565a9)) return -1;
  *type = Get32(h + 12);
  *len = Get32(h + 16);
  for (uint32_t left = *len; left > 0;) {
    unsigned char scratch[4096];
    uint32_t n = left < sizeof scratch ? left : sizeof scratch;
    if (ReadFull(fd, scratch, n) != 0) return -1;
    size_t at = *len - left;
    if (at < cap) memcpy(buf + at, scratch, cap - at < n ? cap - at : n);
    left -= n;
  }
  return 0;
}

/* NBD_OPT_GO on the default export without structured replies; returns the
 * export size, or 0 on failure. */
static uint64_t Go(int fd) {
  static const unsigned char kEmpty[6] = {0};
  if (Hello(fd) != 0 || SendOption(fd, kOptGo, kEmpty, sizeof kEmpty) != 0) return 0;
  uint64_t size = 0;
  for (;;) {
    unsigned char buf[64];
    uint32_t type, len;
    if (OptionReply(fd, &type, buf, sizeof buf, &len) != 0) return 0;
    if (type == kRepInfo && len >= 12 && buf[0] == 0 && buf[1] == 0) size = Get64(buf + 2);
    if (type == kRepAck) return size;
    if (type & 0x80000000u) return 0;
  }
}

static void RequestHeader(unsigned char* h, uint16_t type, uint64_t handle, uint64_t off,
                          uint32_t len) {
  Put32(h, 0x25609513);
  Put16(h + 4, 0);
  Put16(h + 6, type);
  Put64(h + 8, handle);
  Put64(h + 16, off);
  Put32(h + 24, len);
}

static int SendRequest(int fd, uint16_t type, uint64_t handle, uint64_t off, uint32_t len) {
  unsigned char h[28];
  RequestHeader(h, type, handle, off, len);
  return WriteFull(fd, h, 28);
}

/* A simple reply: its error, the handle checked. A successful READ's data
 * (`data_len` bytes) is read into data (or discarded when data is NULL). */
static int SimpleReply(int fd, uint64_t handle, uint32_t* error, unsigned char* data,
                       uint32_t data_len) {
  unsigned char h[16];
  if (ReadFull(fd, h, 16) != 0 || Get32(h) != 0x67446698 || Get64(h + 8) != handle) return -1;
  *error = Get32(h + 4);
  if (*error != 0 || data_len == 0) return 0;
  if (data != NULL) return ReadFull(fd, data, data_len);
  for (uint32_t left = data_len; left > 0;) {
    unsigned char scratch[65536];
    uint32_t n = left < sizeof scratch ? left : sizeof scratch;
    if (ReadFull(fd, scratch, n) != 0) return -1;
    left -= n;
  }
  return 0;
}

static int Exists(const char* path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static double NowMs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t Rand(uint64_t n) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng % n;
}

/* ---- modes ---- */

static int Good(char** argv) {
  const uint64_t region = strtoull(argv[1], NULL, 10);
  const char* stop = argv[2];
  const double deadline = NowMs() + 1e3 * atof(argv[3]);
  struct nbd_handle* h = ConnectOrExit(argv[0], 0);
  unsigned char* model = calloc(1, region);
  unsigned char* buf = malloc(256 << 10);
  char ready[4096];
  snprintf(ready, sizeof ready, "%s.ready", stop);
  TouchFile(ready);
  uint64_t ops = 0;
  double max_ms = 0;
  uint64_t max_kind = 0;
  while (!Exists(stop) && NowMs() < deadline && failures == 0) {
    const uint64_t len = 1 + Rand(256 << 10);
    const uint64_t off = Rand(region - len + 1);
    const uint64_t kind = Rand(10);
    const double t0 = NowMs();
    int rc;
    if (kind < 4) {
      for (uint64_t i = 0; i < len; i++) buf[i] = (unsigned char)(ops * 131 + i * 7);
      rc = nbd_pwrite(h, buf, len, off, Rand(4) == 0 ? LIBNBD_CMD_FLAG_FUA : 0);
      if (rc == 0) memcpy(model + off, buf, len);
    } else if (kind < 5) {
      rc = nbd_zero(h, len, off, 0);
      if (rc == 0) memset(model + off, 0, len);
    } else if (kind < 6) {
      rc = nbd_flush(h, 0);
    } else {
      rc = nbd_pread(h, buf, len, off, 0);
      CHECK(rc != 0 || memcmp(buf, model + off, len) == 0,
            "good: read [%" PRIu64 ", +%" PRIu64 ") differs from what it wrote", off, len);
    }
    const double ms = NowMs() - t0;
    if (ms > max_ms) {
      max_ms = ms;
      max_kind = kind;
    }
    CHECK(rc == 0, "good: op %" PRIu64 " kind %" PRIu64 " failed: %s", ops, kind,
          nbd_get_error());
    CHECK(ms < 30000, "good: one request took %.0f ms (starved)", ms);
    ops++;
  }
  for (uint64_t off = 0; off < region && failures == 0; off += 256 << 10) {
    uint64_t n = region - off < (256 << 10) ? region - off : (256 << 10);
    CHECK(nbd_pread(h, buf, n, off, 0) == 0, "good: final read: %s", nbd_get_error());
    CHECK(memcmp(buf, model + off, n) == 0, "good: final read at %" PRIu64 " differs", off);
  }
  nbd_shutdown(h, 0);
  nbd_close(h);
  free(buf);
  free(model);
  static const char* const kKinds[] = {"write", "write", "write", "write", "zero",
                                       "flush", "read", "read", "read", "read"};
  printf("good: %" PRIu64 " ops, slowest %.0f ms (a %s)\n", ops, max_ms, kKinds[max_kind]);
  return failures ? 1 : 0;
}

static int Churn(char** argv) {
  const char* path = argv[0];
  const int count = atoi(argv[1]);
  const uint64_t scratch = strtoull(argv[2], NULL, 10);
  unsigned char junk[4096];
  memset(junk, 0xa5, sizeof junk);
  int completed = 0;
  for (int i = 0; i < count; i++) {
    int fd = Dial(path);
    unsigned char h[28];
    switch (i % 12) {
      case 0: break;                   /* connect, then hang up */
      case 1: Greeting(fd, 5); break;  /* inside the greeting */
      case 2:                          /* half the client flags */
        if (Greeting(fd, 18) == 0) WriteFull(fd, "\0\0", 2);
        break;
      case 3:  /* half an option header */
        OptionHeader(h, kOptList, 0);
        if (Hello(fd) == 0) WriteFull(fd, h, 10);
        break;
      case 4:  /* an option promising 1000 bytes, sending 10 */
        OptionHeader(h, kOptInfo, 1000);
        if (Hello(fd) == 0 && WriteFull(fd, h, 16) == 0) WriteFull(fd, junk, 10);
        break;
      case 5: Go(fd); break;  /* in transmission, no DISC */
      case 6:                 /* half a request header */
        RequestHeader(h, kCmdRead, 1, 0, 4096);
        if (Go(fd)) WriteFull(fd, h, 13);
        break;
      case 7:  /* a 1 MiB WRITE with 8 KiB of its payload */
        if (Go(fd) && SendRequest(fd, kCmdWrite, 2, scratch, 1 << 20) == 0)
          for (int k = 0; k < 2; k++) WriteFull(fd, junk, sizeof junk);
        break;
      case 8:  /* replies left unread */
        if (Go(fd))
          for (int k = 0; k < 16; k++) SendRequest(fd, kCmdRead, 10 + k, 0, 1 << 20);
        break;
      case 9:  /* bad request magic: the server drops the stream */
        if (Go(fd)) WriteFull(fd, junk, 28);
        break;
      case 10: WriteFull(fd, junk, sizeof junk); break;  /* garbage for a handshake */
      case 11:                                           /* proper */
        if (Go(fd) && SendRequest(fd, kCmdDisc, 3, 0, 0) == 0) completed++;
        break;
    }
    close(fd);
  }
  CHECK(completed == count / 12, "churn: %d of %d clean sessions completed", completed,
        count / 12);
  printf("churn: %d connections dropped at 12 points\n", count);
  return failures ? 1 : 0;
}

static int Slow(char** argv) {
  const char* path = argv[0];
  const int conns = atoi(argv[1]);
  const int reads = atoi(argv[2]);
  const uint32_t len = (uint32_t)strtoul(argv[3], NULL, 10);
  const char* stop = argv[4];
  int fds[64];
  if (conns > 64) return 2;
  for (int c = 0; c < conns; c++) {
    fds[c] = Dial(path);
    const uint64_t size = Go(fds[c]);
    CHECK(size >= len, "slow: GO failed");
    for (int r = 0; r < reads && size >= len; r++)
      CHECK(SendRequest(fds[c], kCmdRead, r, Rand(size - len + 1) & ~UINT64_C(4095), len) == 0,
            "slow: cannot send read %d", r);
  }
  /* Never read a reply; hold on until told (at most 100 s). */
  for (int i = 0; i < 1000 && !Exists(stop); i++) usleep(100 * 1000);
  for (int c = 0; c < conns; c++) close(fds[c]);
  printf("slow: %d connections x %d unread %u-byte reads\n", conns, reads, len);
  return failures ? 1 : 0;
}

static int Options(char** argv) {
  const int count = atoi(argv[1]);
  const int limit = atoi(argv[2]);
  int fd = Dial(argv[0]);
  CHECK(Hello(fd) == 0, "options: handshake failed");
  static const unsigned char kInfoDefault[6] = {0}; /* name "", no info requests */
  static const unsigned char kNoQueries[8] = {0};   /* name "", no queries */
  int answered = 0, refused = 0;
  for (int i = 0; i < count && failures == 0 && !refused; i++) {
    const int kind = i % 4;
    const uint32_t code = kind == 0 ? kOptList : kind == 1 ? kOptInfo
                        : kind == 2 ? 1000 + (uint32_t)i : kOptListMetaContext;
    int rc = kind == 1 ? SendOption(fd, code, kInfoDefault, sizeof kInfoDefault)
             : kind == 3 ? SendOption(fd, code, kNoQueries, sizeof kNoQueries)
                         : SendOption(fd, code, NULL, 0);
    if (rc != 0) break;  /* the server may already have hung up */
    for (;;) {           /* replies until the final one */
      unsigned char buf[64];
      uint32_t type, len;
      if (OptionReply(fd, &type, buf, sizeof buf, &len) != 0) {
        CHECK(0, "options: EOF without an answer to option %d", i);
        break;
      }
      if (type == kRepErrPolicy) {
        refused = 1;
      } else if (type == kRepAck || (type & 0x80000000u)) {
        answered++;
      } else {
        continue;
      }
      break;
    }
  }
  CHECK(refused, "options: %d options answered, never refused", answered);
  CHECK(answered == limit, "options: %d answered before the refusal, want %d", answered, limit);
  unsigned char b;
  CHECK(ReadFull(fd, &b, 1) != 0, "options: session still open after the refusal");
  close(fd);
  printf("options: %d answered, then NBD_REP_ERR_POLICY and EOF\n", answered);
  return failures ? 1 : 0;
}

static int Flood(char** argv) {
  const int count = atoi(argv[1]);
  int fd = Dial(argv[0]);
  if (Hello(fd) != 0) return 1;
  fcntl(fd, F_SETFL, O_NONBLOCK);
  int sent = 0;
  for (; sent < count; sent++) {
    unsigned char h[16];
    OptionHeader(h, kOptList, 0);
    if (send(fd, h, 16, MSG_NOSIGNAL) != 16) break; /* the server stopped reading */
  }
  close(fd);
  printf("flood: %d options written, no reply read\n", sent);
  return 0;
}

/* One request on a raw simple-reply session; checks its error and, for a
 * successful READ, that the data arrived. */
static void Expect(int fd, uint16_t type, uint64_t off, uint32_t len, uint32_t send_payload,
                   uint32_t want_error, const char* what) {
  static uint64_t handle = 100;
  unsigned char* payload = NULL;
  handle++;
  int rc = SendRequest(fd, type, handle, off, len);
  if (rc == 0 && type == kCmdWrite && send_payload > 0) {
    payload = malloc(send_payload);
    memset(payload, 0x6b, send_payload);
    rc = WriteFull(fd, payload, send_payload);
    free(payload);
  }
  uint32_t err = 0;
  const uint32_t data = type == kCmdRead ? len : 0;
  if (rc == 0) rc = SimpleReply(fd, handle, &err, NULL, data);
  CHECK(rc == 0, "lengths: %s: no reply (stream lost)", what);
  CHECK(rc != 0 || err == want_error, "lengths: %s: error %u, want %u", what, err, want_error);
}

static int Lengths(char** argv) {
  const uint64_t size = strtoull(argv[1], NULL, 10);
  const uint64_t scratch = strtoull(argv[2], NULL, 10);
  int fd = Dial(argv[0]);
  CHECK(Go(fd) == size, "lengths: GO failed or wrong size");
  const uint32_t ok_lengths[] = {1, 511, 512, 4095, 4096, 65537, 1 << 20, kMaxPayload - 1,
                                 kMaxPayload};
  char what[128];
  for (size_t i = 0; i < sizeof ok_lengths / sizeof ok_lengths[0]; i++) {
    const uint32_t n = ok_lengths[i];
    snprintf(what, sizeof what, "READ of %u", n);
    Expect(fd, kCmdRead, 0, n, 0, 0, what);
    snprintf(what, sizeof what, "WRITE of %u", n);
    Expect(fd, kCmdWrite, scratch, n, n, 0, what);
  }
  /* Past the maximum payload: EINVAL; a WRITE's payload is skipped, so
   * sending it keeps the stream in sync. */
  Expect(fd, kCmdRead, 0, kMaxPayload + 1, 0, EINVAL, "READ of max+1");
  Expect(fd, kCmdRead, 0, 64u << 20, 0, EINVAL, "READ of 64 MiB");
  Expect(fd, kCmdRead, 0, UINT32_MAX, 0, EINVAL, "READ of 4 GiB - 1");
  Expect(fd, kCmdWrite, scratch, kMaxPayload + 1, kMaxPayload + 1, EINVAL, "WRITE of max+1");
  Expect(fd, kCmdWrite, scratch, 48u << 20, 48u << 20, EINVAL, "WRITE of 48 MiB");
  /* Zero lengths and absurd offsets. */
  Expect(fd, kCmdRead, 0, 0, 0, EINVAL, "READ of 0");
  Expect(fd, kCmdWrite, 0, 0, 0, EINVAL, "WRITE of 0");
  Expect(fd, kCmdRead, size, 1, 0, EINVAL, "READ at the end");
  Expect(fd, kCmdRead, size - 1, 2, 0, EINVAL, "READ across the end");
  Expect(fd, kCmdRead, UINT64_MAX, 1, 0, EINVAL, "READ at 2^64-1");
  Expect(fd, kCmdRead, UINT64_MAX - 4095, 4096, 0, EINVAL, "READ ending at 2^64");
  Expect(fd, kCmdRead, UINT64_C(1) << 63, kMaxPayload, 0, EINVAL, "READ of max at 2^63");
  Expect(fd, kCmdWrite, UINT64_MAX - 10, 4096, 4096, ENOSPC, "WRITE wrapping 2^64");
  Expect(fd, kCmdWrite, size - 1, 2, 2, ENOSPC, "WRITE across the end");
  Expect(fd, kCmdRead, size - 1, 1, 0, 0, "READ of the last byte");
  /* TRIM and WRITE_ZEROES have no payload: any length up to the export. */
  Expect(fd, kCmdTrim, scratch, (uint32_t)(size - scratch), 0, 0, "TRIM of the scratch half");
  Expect(fd, kCmdWriteZeroes, scratch, (uint32_t)(size - scratch), 0, 0,
         "WRITE_ZEROES of the scratch half");
  Expect(fd, kCmdWriteZeroes, 0, UINT32_MAX, 0, ENOSPC, "WRITE_ZEROES of 4 GiB - 1");
  Expect(fd, kCmdTrim, UINT64_MAX, 1, 0, ENOSPC, "TRIM at 2^64-1");
  /* Unknown command with a length: EINVAL, no payload is assumed. */
  Expect(fd, 77, 0, 4096, 0, EINVAL, "unknown command 77");
  /* Still in sync: one more good read, then a WRITE header promising
   * 4 GiB - 1 followed by a hang-up (the server must not wait for it). */
  Expect(fd, kCmdRead, 0, 4096, 0, 0, "READ after the hostile ones");
  SendRequest(fd, kCmdWrite, 999, 0, UINT32_MAX);
  close(fd);
  printf("lengths: every length and offset answered as specified\n");
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc == 6 && strcmp(argv[1], "good") == 0) return Good(argv + 2);
  if (argc == 5 && strcmp(argv[1], "churn") == 0) return Churn(argv + 2);
  if (argc == 7 && strcmp(argv[1], "slow") == 0) return Slow(argv + 2);
  if (argc == 5 && strcmp(argv[1], "options") == 0) return Options(argv + 2);
  if (argc == 4 && strcmp(argv[1], "flood") == 0) return Flood(argv + 2);
  if (argc == 5 && strcmp(argv[1], "lengths") == 0) return Lengths(argv + 2);
  fprintf(stderr, "usage: see the comment at the top of hostile_scale_client.c\n");
  return 2;
}
