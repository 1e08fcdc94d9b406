/* stress_client: seeded concurrency stress of a `thindisk serve` export,
 * verified against an in-memory model of the whole export.
 *
 * Usage:
 *   stress_client run URI SIZE SEED OPS CONNS QD MODEL_IN MODEL_OUT
 *     Opens CONNS connections (the server must advertise multi-conn) and
 *     keeps up to QD requests in flight on each: OPS random reads, writes
 *     (1 byte .. 1 MiB, byte/512/4K/64K alignment), write_zeroes (plain,
 *     NO_HOLE, FAST_ZERO), trims and flushes over the whole SIZE-byte
 *     export. MODEL_IN is the export's starting content ("-": all zeros).
 *     At the end: every byte is re-read and compared, the export flushed,
 *     and the model written to MODEL_OUT (a raw image of what the export
 *     must hold).
 *   stress_client verify URI SIZE MODEL
 *     Reads the whole export and compares it with MODEL.
 *
 * Why the model is exact although requests overlap over time and across
 * connections: the client never has two requests in flight whose ranges
 * overlap (one interval lock over every connection), so each request's
 * effect is independent of the order in which the server runs them. A
 * read is compared with the model when it completes; a write, zero or trim
 * changes the model when it succeeds. Semantics asserted exactly:
 *   - trim and write_zeroes (any flags) read back as zeros, clones included
 *     (block/device.h: "for a clone, zeros, not backing data");
 *   - a FAST_ZERO request refused with ENOTSUP changed nothing.
 * Every other error fails the run. Exit 0 on success; on failure prints
 * the seed and the first mismatches. */
#include <errno.h>
#include <inttypes.h>
#include <libnbd.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_client.h"

#define MAX_CONNS 16
#define MAX_QD 64
#define MAX_OP_BYTES (1u << 20)
#define MAX_REPORTED 10

enum OpType { kRead, kWrite, kZero, kTrim, kFlush };
static const char* const kOpNames[] = {"read", "write", "zero", "trim", "flush"};

struct Op {
  int active;
  int type;
  int conn;
  uint64_t seq;
  uint64_t off;
  uint32_t len;
  uint32_t flags;
  unsigned char* buf;
};

static uint64_t g_seed;
static uint64_t g_rng;
static unsigned char* g_model;
static uint64_t g_size;
static struct Op g_ops[MAX_CONNS * MAX_QD];
static int g_inflight[MAX_CONNS];
static int g_failures;
static uint64_t g_counts[5], g_fast_zero_refused;

static uint64_t Rand(uint64_t n) { return SplitMix64(&g_rng) % n; }

static void Fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void Fail(const char* fmt, ...) {
  va_list ap;
  g_failures++;
  if (g_failures > MAX_REPORTED) return;
  fprintf(stderr, "FAIL (seed %" PRIu64 "): ", g_seed);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

/* Compares [off, off+len) of the export, as read into `got`, with the model. */
static void Compare(const unsigned char* got, uint64_t off, uint64_t len, const char* what) {
  if (memcmp(got, g_model + off, len) == 0) return;
  uint64_t i = 0;
  while (got[i] == g_model[off + i]) i++;
  uint64_t j = len;
  while (got[j - 1] == g_model[off + j - 1]) j--;
  Fail("%s [%" PRIu64 ", +%" PRIu64 "): bytes differ in [%" PRIu64 ", %" PRIu64
       "): first got 0x%02x want 0x%02x",
       what, off, len, off + i, off + j, got[i], g_model[off + i]);
}

static int Overlaps(uint64_t off, uint32_t len) {
  for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++) {
    const struct Op* o = &g_ops[i];
    if (o->active && o->len && off < o->off + o->len && o->off < off + len) return 1;
  }
  return 0;
}

/* A random range: mostly small, sometimes up to 1 MiB, at one of four
 * alignments, inside the export. */
static void RandomRange(uint64_t* off, uint32_t* len) {
  static const uint32_t kAlign[] = {1, 512, 4096, 65536};
  const uint32_t align = kAlign[Rand(4)];
  const uint64_t r = Rand(100);
  uint64_t l = r < 40   ? 1 + Rand(4096)
               : r < 70 ? 4096 + Rand(60 << 10)
               : r < 90 ? (64 << 10) + Rand(192 << 10)
                        : (256 << 10) + Rand((MAX_OP_BYTES - (256 << 10)) + 1);
  l = (l + align - 1) / align * align;
  if (l > MAX_OP_BYTES) l = MAX_OP_BYTES / align * align;
  if (l > g_size) l = g_size;
  uint64_t o = Rand(g_size - l + 1) / align * align;
  *off = o;
  *len = (uint32_t)l;
}

static int OnComplete(void* user, int* error) {
  struct Op* op = user;
  const int err = *error;
  if (op->type == kZero && (op->flags & LIBNBD_CMD_FLAG_FAST_ZERO) && err == ENOTSUP) {
    g_fast_zero_refused++; /* the model stays: a refused fast zero changed nothing */
  } else if (err != 0) {
    Fail("%s #%" PRIu64 " conn %d [%" PRIu64 ", +%u) flags 0x%x: %s", kOpNames[op->type],
         op->seq, op->conn, op->off, op->len, op->flags, strerror(err));
  } else if (op->type == kRead) {
    char what[64];
    snprintf(what, sizeof what, "read #%" PRIu64 " conn %d", op->seq, op->conn);
    Compare(op->buf, op->off, op->len, what);
  } else if (op->type == kWrite) {
    memcpy(g_model + op->off, op->buf, op->len);
  } else if (op->type == kZero || op->type == kTrim) {
    memset(g_model + op->off, 0, op->len);
  }
  g_counts[op->type]++;
  free(op->buf);
  op->buf = NULL;
  op->active = 0;
  g_inflight[op->conn]--;
  return 1; /* retire the command */
}

static struct Op* FreeSlot(void) {
  for (size_t i = 0; i < sizeof g_ops / sizeof g_ops[0]; i++)
    if (!g_ops[i].active) return &g_ops[i];
  return NULL;
}

/* Issues one random request on connection c. Returns 0 when every range
 * tried collided with a request in flight (try again after completions). */
static int Issue(struct nbd_handle* h, int c, uint64_t seq) {
  struct Op* op = FreeSlot();
  if (op == NULL) return 0;
  const uint64_t r = Rand(100);
  int type = r < 35 ? kRead : r < 70 ? kWrite : r < 83 ? kZero : r < 96 ? kTrim : kFlush;
  uint64_t off = 0;
  uint32_t len = 0;
  if (type != kFlush) {
    int tries = 0;
    do RandomRange(&off, &len);
    while (Overlaps(off, len) && ++tries < 8);
    if (tries == 8) return 0;
  }
  memset(op, 0, sizeof *op);
  op->active = 1;
  op->type = type;
  op->conn = c;
  op->seq = seq;
  op->off = off;
  op->len = len;
  nbd_completion_callback cb = {.callback = OnComplete, .user_data = op};
  int64_t cookie = -1;
  switch (type) {
    case kRead:
      op->buf = malloc(len);
      cookie = nbd_aio_pread(h, op->buf, len, off, cb, op->flags);
      break;
    case kWrite: {
      op->buf = malloc(len);
      uint64_t s = g_seed ^ (seq * UINT64_C(0x100000001b3));
      for (uint32_t i = 0; i < len; i += 8) {
        uint64_t v = SplitMix64(&s);
        memcpy(op->buf + i, &v, len - i < 8 ? len - i : 8);
      }
      if (Rand(8) == 0) op->flags = LIBNBD_CMD_FLAG_FUA;
      cookie = nbd_aio_pwrite(h, op->buf, len, off, cb, op->flags);
      break;
    }
    case kZero: {
      const uint64_t k = Rand(3);
      if (k == 1) op->flags = LIBNBD_CMD_FLAG_NO_HOLE;
      if (k == 2 && nbd_can_fast_zero(h) == 1) op->flags = LIBNBD_CMD_FLAG_FAST_ZERO;
      cookie = nbd_aio_zero(h, len, off, cb, op->flags);
      break;
    }
    case kTrim:
      cookie = nbd_aio_trim(h, len, off, cb, 0);
      break;
    case kFlush:
      cookie = nbd_aio_flush(h, cb, 0);
      break;
  }
  g_inflight[c]++;
  if (cookie == -1) {
    /* libnbd refused it before sending; the callback is not called. */
    Fail("submit %s [%" PRIu64 ", +%u): %s", kOpNames[type], off, len, nbd_get_error());
    free(op->buf);
    op->active = 0;
    g_inflight[c]--;
    return -1;
  }
  return 1;
}

/* Waits until some connection can make progress and lets libnbd run it
 * (completions call OnComplete). Returns -1 on an error or a hang. */
static int PollOnce(struct nbd_handle** hs, int n) {
  struct pollfd fds[MAX_CONNS];
  for (int i = 0; i < n; i++) {
    unsigned dir = nbd_aio_get_direction(hs[i]);
    fds[i].fd = nbd_aio_get_fd(hs[i]);
    fds[i].events = ((dir & LIBNBD_AIO_DIRECTION_READ) ? POLLIN : 0) |
                    ((dir & LIBNBD_AIO_DIRECTION_WRITE) ? POLLOUT : 0);
    fds[i].revents = 0;
  }
  int rc = poll(fds, n, 30000);
  if (rc == 0) {
    Fail("no progress for 30 s");
    return -1;
  }
  if (rc < 0) return errno == EINTR ? 0 : -1;
  for (int i = 0; i < n; i++) {
    int ret = 0;
    if (fds[i].revents & (POLLIN | POLLHUP | POLLERR))
      ret = nbd_aio_notify_read(hs[i]);
    else if (fds[i].revents & POLLOUT)
      ret = nbd_aio_notify_write(hs[i]);
    if (ret == -1) {
      Fail("connection %d: %s", i, nbd_get_error());
      return -1;
    }
  }
  return 0;
}

/* Reads the whole export in 1 MiB pieces, piece i on connection i % n (so
 * every connection must see every other's writes: multi-conn), and
 * compares it with the model. */
static void VerifyAll(struct nbd_handle** hs, int n, const char* what) {
  unsigned char* buf = malloc(MAX_OP_BYTES);
  uint64_t i = 0;
  for (uint64_t off = 0; off < g_size; off += MAX_OP_BYTES, i++) {
    uint64_t len = g_size - off < MAX_OP_BYTES ? g_size - off : MAX_OP_BYTES;
    if (nbd_pread(hs[i % n], buf, len, off, 0) == -1) {
      Fail("%s: read at %" PRIu64 ": %s", what, off, nbd_get_error());
      break;
    }
    Compare(buf, off, len, what);
  }
  free(buf);
}

static int LoadModel(const char* path) {
  g_model = calloc(1, g_size);
  if (strcmp(path, "-") == 0) return 0;
  FILE* f = fopen(path, "rb");
  if (f == NULL || fread(g_model, 1, g_size, f) != g_size) {
    fprintf(stderr, "cannot read %" PRIu64 " bytes of model %s\n", g_size, path);
    return -1;
  }
  fclose(f);
  return 0;
}

static int Run(char** argv) {
  const char* uri = argv[0];
  g_size = strtoull(argv[1], NULL, 10);
  g_seed = g_rng = strtoull(argv[2], NULL, 10);
  const uint64_t ops = strtoull(argv[3], NULL, 10);
  const int conns = atoi(argv[4]);
  const int qd = atoi(argv[5]);
  if (conns < 1 || conns > MAX_CONNS || qd < 1 || qd > MAX_QD || g_size == 0) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  if (LoadModel(argv[6]) != 0) return 2;
  struct nbd_handle* hs[MAX_CONNS];
  for (int i = 0; i < conns; i++) {
    hs[i] = ConnectOrExit(uri, 0);
    if (nbd_can_multi_conn(hs[i]) != 1) Fail("server does not advertise multi-conn");
    if ((uint64_t)nbd_get_size(hs[i]) != g_size) Fail("export size is not %" PRIu64, g_size);
  }
  if (g_failures) return 1;
  VerifyAll(hs, conns, "initial content");

  const time_t start = time(NULL);
  uint64_t issued = 0;
  while (issued < ops && g_failures == 0) {
    for (int c = 0; c < conns && issued < ops; c++) {
      while (g_inflight[c] < qd && issued < ops && Issue(hs[c], c, issued) > 0) issued++;
    }
    int busy = 0;
    for (int c = 0; c < conns; c++) busy += g_inflight[c];
    if (busy == 0) continue;
    if (PollOnce(hs, conns) != 0) break;
  }
  /* Drain what is still in flight (after a failure too, to report it). */
  for (int c = 0; c < conns; c++)
    while (g_inflight[c] > 0)
      if (PollOnce(hs, conns) != 0) break;
  fprintf(stderr,
          "stress: seed %" PRIu64 ", %" PRIu64 " ops in %lds: %" PRIu64 " reads, %" PRIu64
          " writes, %" PRIu64 " zeroes (%" PRIu64 " fast-zero refused), %" PRIu64
          " trims, %" PRIu64 " flushes\n",
          g_seed, issued, (long)(time(NULL) - start), g_counts[kRead], g_counts[kWrite],
          g_counts[kZero], g_fast_zero_refused, g_counts[kTrim], g_counts[kFlush]);

  /* Every byte again, spread over the connections. */
  if (g_failures == 0) VerifyAll(hs, conns, "final re-read");
  if (nbd_flush(hs[conns - 1], 0) == -1) Fail("final flush: %s", nbd_get_error());
  for (int c = 0; c < conns; c++) {
    nbd_shutdown(hs[c], 0);
    nbd_close(hs[c]);
  }
  FILE* f = fopen(argv[7], "wb");
  if (f == NULL || fwrite(g_model, 1, g_size, f) != g_size || fclose(f) != 0) {
    fprintf(stderr, "cannot write model %s\n", argv[7]);
    return 2;
  }
  if (g_failures) fprintf(stderr, "%d failure(s); rerun with THINDISK_SEED=%" PRIu64 "\n",
                          g_failures, g_seed);
  return g_failures ? 1 : 0;
}

static int Verify(char** argv) {
  g_size = strtoull(argv[1], NULL, 10);
  if (LoadModel(argv[2]) != 0) return 2;
  struct nbd_handle* h = ConnectOrExit(argv[0], 0);
  if ((uint64_t)nbd_get_size(h) != g_size) Fail("export size is not %" PRIu64, g_size);
  VerifyAll(&h, 1, "verify after restart");
  nbd_shutdown(h, 0);
  nbd_close(h);
  return g_failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc == 10 && strcmp(argv[1], "run") == 0) return Run(argv + 2);
  if (argc == 5 && strcmp(argv[1], "verify") == 0) return Verify(argv + 2);
  fprintf(stderr,
          "usage: %s run URI SIZE SEED OPS CONNS QD MODEL_IN MODEL_OUT\n"
          "       %s verify URI SIZE MODEL\n",
          argv[0], argv[0]);
  return 2;
}
