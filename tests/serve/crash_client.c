/* crash_client: a seeded libnbd writer that logs what the server
 * acknowledged, and a verifier that checks an export against that log
 * (tests/serve/kill.sh and full_disk.sh).
 *
 * Usage:
 *   crash_client run    URI LOG SEED ZONES MAX_OPS QD
 *       Random writes (sector-aligned and byte-unaligned), write_zeroes,
 *       FUA writes and flushes, up to QD requests in flight (never two
 *       overlapping ones), into ZONES, until MAX_OPS were issued (then a
 *       final flush; exit 0, or 4 if any request failed) or the connection
 *       dies (exit 3).
 *   crash_client seq    URI LOG SEED ZONES CHUNK
 *       Writes ZONES front to back in CHUNK-byte writes (4 in flight) until
 *       the first error reply, then tries a flush. Prints
 *       "first_error=E flush=F" (errno values, 0 for success). Exit 0 if
 *       the connection is still up, 3 if it died.
 *   crash_client verify URI LOG SEED ZONES
 *       Reads ZONES and checks every byte against the model built from LOG.
 *
 * ZONES is "OFFSET+LENGTH,..." (bytes, multiples of 512). SEED is any
 * 64-bit number; it is stamped in every sector written, with the write's
 * index (global across runs: a run continues after the largest index in
 * LOG) and the sector number, so a sector tells which write it came from.
 *
 * With CRASH_CLIENT_READY=PATH, run and seq create PATH once connected.
 * Requests in flight get CRASH_CLIENT_REPLY_TIMEOUT seconds (default 60)
 * without any reply or other progress; then the client reports a hung
 * server and exits 2.
 * Several run clients may share one LOG (O_APPEND keeps each line whole and
 * in real-time order, so a flush logged after another client's ack covers
 * it: NBD multi-conn): each gets CRASH_CLIENT_FIRST=N (the same first free
 * index) and CRASH_CLIENT_STRIDE=K/N, the script logs "S" and the clients
 * run with CRASH_CLIENT_SAME_SERVER; their ZONES must not overlap.
 *
 * LOG lines, appended with one write(2) each (only the server is killed;
 * what this process wrote to the file survives it):
 *   S                      a new server lifetime starts (not logged when
 *                          CRASH_CLIENT_SAME_SERVER is set)
 *   W IDX OFF LEN KIND FUA a request is about to be sent (KIND D data, Z zeroes)
 *   A IDX | E IDX ERRNO    its reply: success / error
 *   F IDX                  a flush is about to be sent
 *   FA IDX | FE IDX ERRNO  its reply
 *
 * The model, per byte: a write is durable when it was acknowledged with FUA,
 * or acknowledged before a flush (of the same server lifetime) was sent and
 * that flush succeeded. The byte may read as the last durable write's value
 * (zero before any), or as the value of any write to it issued after that
 * one, acknowledged or not. Anything else is either flushed data lost or a
 * byte never written there. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libnbd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_client.h"

enum { kSector = 512, kMaxZones = 32, kMaxQd = 64, kReadChunk = 1 << 20 };

typedef struct {
  uint64_t off, len;
} Zone;

static Zone zones[kMaxZones];
static int nzones = 0;
static uint64_t seed = 0;
static int log_fd = -1;

static void Die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "crash_client: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

/* ---- Patterns ---------------------------------------------------------- */

static uint64_t Mix(uint64_t x) { return SplitMix64(&x); } /* a pure hash of x */

static uint64_t rng_state = 1;
static uint64_t Rand(void) { return rng_state = Mix(rng_state); }
static uint64_t Below(uint64_t n) { return n ? Rand() % n : 0; }

static void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The 512 bytes write IDX puts in SECTOR: a stamp, then noise from both,
 * the last 240 bytes one word repeated (so clusters compress about 2:1). */
static void SectorPattern(uint64_t idx, uint64_t sector, uint8_t out[kSector]) {
  memcpy(out, "TDCRASH1", 8);
  Put64(out + 8, seed);
  Put64(out + 16, idx);
  Put64(out + 24, sector);
  uint64_t x = Mix(seed ^ Mix(idx ^ Mix(sector)));
  for (int i = 32; i < kSector; i += 8) Put64(out + i, i < 272 ? (x = Mix(x)) : x);
}

static void FillPattern(uint64_t idx, uint64_t off, uint64_t len, uint8_t* buf) {
  uint8_t pat[kSector];
  uint64_t pos = off;
  while (pos < off + len) {
    uint64_t sector = pos / kSector, in = pos % kSector;
    uint64_t n = kSector - in;
    if (n > off + len - pos) n = off + len - pos;
    SectorPattern(idx, sector, pat);
    memcpy(buf + (pos - off), pat + in, n);
    pos += n;
  }
}

/* ---- Arguments and the log --------------------------------------------- */

static void ParseZones(const char* s) {
  while (*s) {
    char* end;
    if (nzones == kMaxZones) Die("too many zones");
    zones[nzones].off = strtoull(s, &end, 0);
    if (*end != '+') Die("bad zone list at '%s'", s);
    zones[nzones].len = strtoull(end + 1, &end, 0);
    if (zones[nzones].off % kSector || zones[nzones].len % kSector || !zones[nzones].len)
      Die("zones must be non-empty multiples of %d bytes", kSector);
    nzones++;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') Die("bad zone list at '%s'", end);
  }
  if (!nzones) Die("no zones");
}

static void Log(const char* fmt, ...) {
  char line[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (write(log_fd, line, (size_t)n) != n) Die("log write: %s", strerror(errno));
}

/* The largest index in LOG, so a new run continues the numbering. */
static uint64_t LastIndex(const char* path) {
  FILE* f = fopen(path, "r");
  uint64_t last = 0, idx;
  char tag[4], line[256];
  if (!f) return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%3s %" SCNu64, tag, &idx) == 2 && idx > last) last = idx;
  fclose(f);
  return last;
}

/* ---- Writers ------------------------------------------------------------ */

typedef struct {
  int used, is_flush, fua;
  uint64_t idx, off, len;
  uint8_t* buf;
} Op;

static Op ops[kMaxQd];
static int first_error = 0;

static int OnDone(void* user, int* error) {
  Op* op = user;
  if (*error) {
    Log("%s %" PRIu64 " %d\n", op->is_flush ? "FE" : "E", op->idx, *error);
    if (!first_error) first_error = *error;
  } else {
    Log("%s %" PRIu64 "\n", op->is_flush ? "FA" : "A", op->idx);
  }
  free(op->buf);
  op->used = 0;
  return 1; /* retire the command */
}

static Op* FreeSlot(int qd) {
  for (int i = 0; i < qd; i++)
    if (!ops[i].used) return &ops[i];
  return NULL;
}

static int Overlaps(uint64_t off, uint64_t len) {
  for (int i = 0; i < kMaxQd; i++)
    if (ops[i].used && !ops[i].is_flush && off < ops[i].off + ops[i].len &&
        ops[i].off < off + len)
      return 1;
  return 0;
}

/* Sends one request in `op` (filled but for buf). Returns 0, or -1 when
 * libnbd refused to send it (logged as an error). */
static int Submit(struct nbd_handle* h, Op* op, char kind, uint32_t flags) {
  nbd_completion_callback cb = {.callback = OnDone, .user_data = op};
  int64_t r;
  op->used = 1;
  op->buf = NULL;
  if (op->is_flush) {
    Log("F %" PRIu64 "\n", op->idx);
    r = nbd_aio_flush(h, cb, 0);
  } else {
    if (op->fua) flags |= LIBNBD_CMD_FLAG_FUA;
    Log("W %" PRIu64 " %" PRIu64 " %" PRIu64 " %c %d\n", op->idx, op->off, op->len, kind, op->fua);
    if (kind == 'Z') {
      r = nbd_aio_zero(h, op->len, op->off, cb, flags);
    } else {
      op->buf = malloc(op->len);
      if (!op->buf) Die("out of memory");
      FillPattern(op->idx, op->off, op->len, op->buf);
      r = nbd_aio_pwrite(h, op->buf, op->len, op->off, cb, flags);
    }
  }
  if (r == -1) { /* the callback is not called when the request was not queued */
    int e = nbd_get_errno() ? nbd_get_errno() : EIO;
    Log("%s %" PRIu64 " %d\n", op->is_flush ? "FE" : "E", op->idx, e);
    free(op->buf);
    op->used = 0;
    if (!first_error) first_error = e;
    return -1;
  }
  return 0;
}

/* How long the server may leave requests in flight without any progress
 * on the connection (CRASH_CLIENT_REPLY_TIMEOUT seconds, default 60): a
 * live server answers within milliseconds, a killed one closes the socket,
 * so waiting longer means it hangs, and the client says so instead of
 * waiting for the test's timeout. */
static int ReplyTimeoutMs(void) {
  static int ms = 0;
  if (!ms) {
    const char* v = getenv("CRASH_CLIENT_REPLY_TIMEOUT");
    long s = v && *v ? strtol(v, NULL, 10) : 60;
    if (s < 1 || s > 3600) Die("CRASH_CLIENT_REPLY_TIMEOUT must be 1..3600 seconds");
    ms = (int)s * 1000;
  }
  return ms;
}

/* Waits for one reply, at most ReplyTimeoutMs() without progress (then
 * exits 2). Returns -1 once the connection is dead. */
static int Poll(struct nbd_handle* h) {
  if (nbd_aio_is_dead(h) || nbd_aio_is_closed(h)) return -1;
  if (nbd_aio_in_flight(h) == 0) return 0;
  int r = nbd_poll(h, ReplyTimeoutMs());
  if (r == 0)
    Die("no progress on %d request(s) in flight for %d s: the server hangs",
        nbd_aio_in_flight(h), ReplyTimeoutMs() / 1000);
  return r == -1 ? -1 : 0;
}

static int Drain(struct nbd_handle* h) {
  while (nbd_aio_in_flight(h) > 0)
    if (Poll(h) == -1) return -1;
  return 0;
}

static void RandomWrite(Op* op, char* kind, uint32_t* flags) {
  const Zone* z = &zones[Below(nzones)];
  uint64_t r = Below(100);
  if (r < 8) { /* byte-unaligned, often inside one sector */
    op->off = z->off + Below(z->len);
    op->len = 1 + Below(1500);
  } else {
    op->off = z->off + Below(z->len / kSector) * kSector;
    op->len = kSector * (1 + Below(r < 45 ? 16 : r < 85 ? 256 : 1024));
  }
  if (op->len > z->off + z->len - op->off) op->len = z->off + z->len - op->off;
  *kind = Below(100) < 15 ? 'Z' : 'D';
  *flags = (*kind == 'Z' && Below(2)) ? LIBNBD_CMD_FLAG_NO_HOLE : 0;
  op->fua = Below(100) < 6;
}

static int RunMode(struct nbd_handle* h, uint64_t next, uint64_t stride, uint64_t max_ops,
                   int qd) {
  rng_state = Mix(seed ^ Mix(next));
  for (uint64_t n = 0; n < max_ops;) {
    Op* op = FreeSlot(qd);
    if (!op) {
      if (Poll(h) == -1) return 3;
      continue;
    }
    memset(op, 0, sizeof *op);
    char kind = 'D';
    uint32_t flags = 0;
    op->is_flush = Below(24) == 0;
    if (!op->is_flush) {
      int tries = 0;
      do RandomWrite(op, &kind, &flags);
      while (Overlaps(op->off, op->len) && ++tries < 8);
      if (tries == 8) {
        if (Poll(h) == -1) return 3;
        continue;
      }
    }
    op->idx = next;
    next += stride;
    n++;
    if (Submit(h, op, kind, flags) == -1) return 3;
  }
  if (Drain(h) == -1) return 3;
  Op* op = &ops[0];
  memset(op, 0, sizeof *op);
  op->is_flush = 1;
  op->idx = next;
  if (Submit(h, op, 0, 0) == -1 || Drain(h) == -1) return 3;
  if (first_error) fprintf(stderr, "crash_client: a request failed: errno %d\n", first_error);
  return first_error ? 4 : 0;
}

static int SeqMode(struct nbd_handle* h, uint64_t next, uint64_t chunk) {
  for (int z = 0; z < nzones && !first_error; z++) {
    for (uint64_t pos = zones[z].off; pos < zones[z].off + zones[z].len && !first_error;) {
      Op* op = FreeSlot(4);
      if (!op) {
        if (Poll(h) == -1) return 3;
        continue;
      }
      memset(op, 0, sizeof *op);
      op->idx = next++;
      op->off = pos;
      op->len = chunk < zones[z].off + zones[z].len - pos ? chunk : zones[z].off + zones[z].len - pos;
      pos += op->len;
      if (Submit(h, op, 'D', 0) == -1) return 3;
    }
  }
  if (Drain(h) == -1) return 3;
  int write_error = first_error;
  first_error = 0;
  Op* op = &ops[0];
  memset(op, 0, sizeof *op);
  op->is_flush = 1;
  op->idx = next;
  if (Submit(h, op, 0, 0) == 0 && Drain(h) == -1) return 3;
  printf("first_error=%d flush=%d\n", write_error, first_error);
  return nbd_aio_is_dead(h) ? 3 : 0;
}

/* ---- The verifier -------------------------------------------------------- */

typedef struct {
  uint64_t off, len;
  uint64_t cover; /* a flush: how many acks of its lifetime it covers */
  char kind;
  uint8_t issued, acked, durable, fua;
} Write;

typedef struct {
  uint32_t w; /* index into writes */
  uint16_t lo, hi;
} Entry;

typedef struct {
  Entry* e;
  uint32_t n, cap;
} Sector;

static Write* writes; /* indexed by IDX */
static uint64_t nwrites_cap = 0;
static Sector* sectors; /* the zones' sectors, zone after zone */
static uint64_t nsectors = 0;

static Write* At(uint64_t idx) {
  if (idx >= nwrites_cap) {
    uint64_t cap = nwrites_cap ? nwrites_cap : 1024;
    while (cap <= idx) cap *= 2;
    writes = realloc(writes, cap * sizeof *writes);
    if (!writes) Die("out of memory");
    memset(writes + nwrites_cap, 0, (cap - nwrites_cap) * sizeof *writes);
    nwrites_cap = cap;
  }
  return &writes[idx];
}

/* The model slot of the byte at OFF, or -1 when OFF is in no zone. */
static int64_t SectorSlot(uint64_t off) {
  uint64_t base = 0;
  for (int z = 0; z < nzones; z++) {
    if (off >= zones[z].off && off < zones[z].off + zones[z].len)
      return (int64_t)(base + (off - zones[z].off) / kSector);
    base += zones[z].len / kSector;
  }
  return -1;
}

static void AddEntries(uint32_t idx, const Write* w) {
  for (uint64_t pos = w->off; pos < w->off + w->len;) {
    uint64_t in = pos % kSector, n = kSector - in;
    if (n > w->off + w->len - pos) n = w->off + w->len - pos;
    int64_t slot = SectorSlot(pos);
    if (slot < 0) Die("write %u at %" PRIu64 " is outside the zones", idx, pos);
    Sector* s = &sectors[slot];
    if (s->n == s->cap) {
      s->cap = s->cap ? 2 * s->cap : 4;
      s->e = realloc(s->e, s->cap * sizeof *s->e);
      if (!s->e) Die("out of memory");
    }
    s->e[s->n++] = (Entry){idx, (uint16_t)in, (uint16_t)(in + n)};
    pos += n;
  }
}

/* Replays LOG into `writes`, deciding which are durable, then into the
 * per-sector lists in issue order. */
static void LoadModel(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) Die("open %s: %s", path, strerror(errno));
  uint64_t* acks = NULL; /* acknowledged, not FUA, in the current lifetime */
  uint64_t nacks = 0, cap = 0, life_start = 0, marked = 0;
  uint64_t max_idx = 0, idx, a, b;
  char line[256], tag[4], kind;
  int fua;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == 'S') {
      life_start = marked = nacks;
      continue;
    }
    if (sscanf(line, "%3s %" SCNu64, tag, &idx) != 2) Die("bad log line: %s", line);
    if (idx > max_idx) max_idx = idx;
    Write* w = At(idx);
    if (!strcmp(tag, "W")) {
      if (sscanf(line, "W %*u %" SCNu64 " %" SCNu64 " %c %d", &a, &b, &kind, &fua) != 4)
        Die("bad log line: %s", line);
      *w = (Write){a, b, 0, kind, 1, 0, 0, (uint8_t)fua};
    } else if (!strcmp(tag, "A")) {
      w->acked = 1;
      if (w->fua) {
        w->durable = 1;
      } else {
        if (nacks == cap && !(acks = realloc(acks, (cap = cap ? 2 * cap : 1024) * sizeof *acks)))
          Die("out of memory");
        acks[nacks++] = idx;
      }
    } else if (!strcmp(tag, "F")) {
      w->cover = nacks;
    } else if (!strcmp(tag, "FA")) {
      /* Acks of this lifetime that came before the flush was sent. */
      uint64_t cover = w->cover;
      for (uint64_t i = marked > life_start ? marked : life_start; i < cover; i++)
        writes[acks[i]].durable = 1;
      if (cover > marked) marked = cover;
    } else if (strcmp(tag, "E") && strcmp(tag, "FE")) {
      Die("bad log line: %s", line);
    }
  }
  fclose(f);
  free(acks);
  for (int z = 0; z < nzones; z++) nsectors += zones[z].len / kSector;
  sectors = calloc(nsectors, sizeof *sectors);
  if (!sectors) Die("out of memory");
  for (uint64_t i = 0; i <= max_idx && i < nwrites_cap; i++)
    if (writes[i].issued) AddEntries((uint32_t)i, &writes[i]);
}

static int reported = 0;
static const uint8_t zero_sector[kSector];

static uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* The value entry J of S gives byte B of SECTOR (patterns cached in PATS). */
static uint8_t EntryByte(const Sector* s, uint32_t j, uint64_t sector, int b,
                         uint8_t pats[][kSector], int* pat_of, int* npats) {
  if (writes[s->e[j].w].kind != 'D') return 0;
  int p = 0;
  while (p < *npats && pat_of[p] != (int)j) p++;
  if (p == *npats) {
    p = *npats < 8 ? (*npats)++ : 7;
    pat_of[p] = (int)j;
    SectorPattern(s->e[j].w, sector, pats[p]);
  }
  return pats[p][b];
}

/* Checks one sector read back. Returns 0 if every byte is allowed. */
static int CheckSector(uint64_t sector, const uint8_t* got, const Sector* s) {
  int last_durable[kSector]; /* per byte: entry position, -1 before any */
  uint8_t pats[8][kSector];
  int pat_of[8], npats = 0, jmin = kSector;
  /* Newest first, so a long history costs one pass over the sector. */
  int unset = kSector, jmax = -1;
  for (int b = 0; b < kSector; b++) last_durable[b] = -2;
  for (int j = (int)s->n - 1; j >= 0 && unset; j--)
    if (writes[s->e[j].w].durable)
      for (int b = s->e[j].lo; b < s->e[j].hi; b++)
        if (last_durable[b] == -2) last_durable[b] = j, unset--;
  for (int b = 0; b < kSector; b++) {
    if (last_durable[b] == -2) last_durable[b] = -1;
    if (last_durable[b] < jmin) jmin = last_durable[b] < 0 ? 0 : last_durable[b];
    if (last_durable[b] > jmax) jmax = last_durable[b];
  }
  /* Fast path: the whole sector is one full-sector write's value (or zeros
   * before any write) that no durable write to any of its bytes follows. */
  if (jmax == -1 && !memcmp(got, zero_sector, kSector)) return 0;
  uint64_t stamped_idx = memcmp(got, "TDCRASH1", 8) ? 0 : Get64(got + 16);
  for (int j = (int)s->n - 1; j >= 0 && j >= jmax; j--) {
    const Entry* e = &s->e[j];
    if (e->lo != 0 || e->hi != kSector) continue;
    if (writes[e->w].kind == 'Z' ? !memcmp(got, zero_sector, kSector)
                                 : e->w == stamped_idx &&
                                       (SectorPattern(e->w, sector, pats[0]),
                                        !memcmp(got, pats[0], kSector)))
      return 0;
  }
  for (int b = 0; b < kSector; b++) {
    int ok = last_durable[b] == -1 && got[b] == 0;
    for (uint32_t j = (uint32_t)jmin; j < s->n && !ok; j++)
      ok = (int)j >= last_durable[b] && b >= s->e[j].lo && b < s->e[j].hi &&
           EntryByte(s, j, sector, b, pats, pat_of, &npats) == got[b];
    if (ok) continue;
    int stale = got[b] == 0 && last_durable[b] >= 0;
    for (int j = 0; j < last_durable[b] && !stale; j++)
      stale = b >= s->e[j].lo && b < s->e[j].hi &&
              EntryByte(s, (uint32_t)j, sector, b, pats, pat_of, &npats) == got[b];
    if (reported++ < 10) {
      int stamped = !memcmp(got, "TDCRASH1", 8);
      fprintf(stderr,
              "FAIL: byte %d of sector %" PRIu64 " (offset %" PRIu64 ") reads 0x%02x: %s\n"
              "    the sector's stamp: %s write #%" PRIu64 " sector %" PRIu64 "\n",
              b, sector, sector * kSector + b, got[b],
              stale ? "(c) an older value: a durable write to it was lost"
                    : "(d) a value never written there",
              stamped ? "" : "(none)", stamped ? Get64(got + 16) : 0,
              stamped ? Get64(got + 24) : 0);
      for (uint32_t j = 0; j < s->n && j < 40; j++) {
        const Write* w = &writes[s->e[j].w];
        fprintf(stderr, "    write #%u %c bytes [%u,%u): %s%s\n", s->e[j].w, w->kind,
                s->e[j].lo, s->e[j].hi,
                w->durable ? "durable" : w->acked ? "acked" : "not acked",
                w->fua ? " (FUA)" : "");
      }
    }
    return 1;
  }
  return 0;
}

static int VerifyMode(struct nbd_handle* h, const char* log_path) {
  LoadModel(log_path);
  static uint8_t buf[kReadChunk];
  uint64_t slot = 0, bad = 0, durable_sectors = 0;
  for (int z = 0; z < nzones; z++) {
    for (uint64_t pos = zones[z].off; pos < zones[z].off + zones[z].len;) {
      uint64_t n = zones[z].off + zones[z].len - pos;
      if (n > kReadChunk) n = kReadChunk;
      if (nbd_pread(h, buf, n, pos, 0) == -1) Die("read at %" PRIu64 ": %s", pos, nbd_get_error());
      for (uint64_t i = 0; i < n; i += kSector, slot++) {
        bad += CheckSector((pos + i) / kSector, buf + i, &sectors[slot]);
        for (uint32_t j = 0; j < sectors[slot].n; j++)
          if (writes[sectors[slot].e[j].w].durable) {
            durable_sectors++;
            break;
          }
      }
      pos += n;
    }
  }
  printf("verified %" PRIu64 " sectors (%" PRIu64 " with durable writes): %" PRIu64 " bad\n",
         nsectors, durable_sectors, bad);
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr,
            "usage: %s run URI LOG SEED ZONES MAX_OPS QD | seq URI LOG SEED ZONES CHUNK |"
            " verify URI LOG SEED ZONES\n",
            argv[0]);
    return 2;
  }
  const char *mode = argv[1], *uri = argv[2], *log_path = argv[3];
  seed = strtoull(argv[4], NULL, 0);
  ParseZones(argv[5]);
  struct nbd_handle* h = ConnectOrExit(uri, 0);
  int rc;
  if (!strcmp(mode, "verify") && argc == 6) {
    rc = VerifyMode(h, log_path);
  } else {
    /* Clients sharing one log take turns in the index space: client K of N
     * uses FIRST+K, FIRST+K+N, ... */
    uint64_t next = LastIndex(log_path) + 1, stride = 1, k = 0;
    const char* first = getenv("CRASH_CLIENT_FIRST");
    const char* share = getenv("CRASH_CLIENT_STRIDE");
    if (first) next = strtoull(first, NULL, 0);
    if (share && (sscanf(share, "%" SCNu64 "/%" SCNu64, &k, &stride) != 2 || k >= stride))
      Die("CRASH_CLIENT_STRIDE must be K/N with K < N");
    next += k;
    log_fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (log_fd < 0) Die("open %s: %s", log_path, strerror(errno));
    if (!getenv("CRASH_CLIENT_SAME_SERVER")) Log("S\n");
    const char* ready = getenv("CRASH_CLIENT_READY"); /* connected: tell the script */
    if (ready) TouchFile(ready);
    if (!strcmp(mode, "run") && argc == 8) {
      int qd = atoi(argv[7]);
      if (qd < 1 || qd > kMaxQd) Die("QD must be 1..%d", kMaxQd);
      rc = RunMode(h, next, stride, strtoull(argv[6], NULL, 0), qd);
    } else if (!strcmp(mode, "seq") && argc == 7) {
      rc = SeqMode(h, next, strtoull(argv[6], NULL, 0));
    } else {
      Die("bad arguments for mode %s", mode);
    }
    close(log_fd);
  }
  if (rc != 3) nbd_shutdown(h, 0);
  nbd_close(h);
  return rc;
}
