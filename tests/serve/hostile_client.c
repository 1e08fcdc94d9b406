/* hostile_client: malformed requests through libnbd against a running
 * `thindisk serve`, checking the exact NBD error for each and that the
 * connection and other clients keep working.
 *
 * Usage: hostile_client RW_URI RO_URI EXPORT_SIZE
 *   RW_URI: a writable export whose first 64 KiB hold the byte 0x5a;
 *   RO_URI: the same image exported read-only.
 * Exit 0 when every check passes; prints each failure.
 *
 * Usage: hostile_client --stdio CMD ARGS...
 *   Runs CMD with the NBD connection on its stdin/stdout (nbd_connect_command,
 *   for `thindisk serve --stdio`) and prints "SIZE FIRSTBYTE" of the export. */
#include <errno.h>
#include <inttypes.h>
#include <libnbd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_client.h"

static struct nbd_handle* Connect(const char* uri, int strict, int meta) {
  struct nbd_handle* h = ConnectOrExit(uri, meta);
  if (!strict && nbd_set_strict_mode(h, 0) == -1) exit(1);
  return h;
}

/* The request must fail with `want` (an errno) and leave the connection
 * usable: a good read of the 0x5a block right after must succeed. */
static void ExpectErrno(struct nbd_handle* h, int rc, int want, const char* what) {
  int got = nbd_get_errno();
  CHECK(rc == -1, "%s: succeeded, want errno %d", what, want);
  if (rc == -1)
    CHECK(got == want, "%s: errno %d (%s), want %d (%s) [%s]", what, got, strerror(got), want,
          strerror(want), nbd_get_error());
  char buf[4096];
  memset(buf, 0, sizeof buf);
  int ok = nbd_pread(h, buf, sizeof buf, 0, 0);
  CHECK(ok == 0, "%s: connection unusable afterwards: %s", what, nbd_get_error());
  CHECK(ok != 0 || (buf[0] == 0x5a && buf[4095] == 0x5a), "%s: wrong data afterwards", what);
}

static int BlockStatusCb(void* user, const char* ctx, uint64_t off, uint32_t* ents, size_t n,
                         int* err) {
  (void)user; (void)ctx; (void)off; (void)ents; (void)n; (void)err;
  return 0;
}

static int StdioMode(char** argv) {
  struct nbd_handle* h = nbd_create();
  if (h == NULL || nbd_connect_command(h, argv) == -1) {
    fprintf(stderr, "connect_command: %s\n", nbd_get_error());
    return 1;
  }
  unsigned char b = 0;
  int64_t size = nbd_get_size(h);
  if (size < 0 || nbd_pread(h, &b, 1, 0, 0) == -1) {
    fprintf(stderr, "stdio read: %s\n", nbd_get_error());
    return 1;
  }
  printf("%" PRId64 " %u\n", size, b);
  nbd_shutdown(h, 0);
  nbd_close(h);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 3 && strcmp(argv[1], "--stdio") == 0) return StdioMode(argv + 2);
  if (argc != 4) {
    fprintf(stderr, "usage: %s RW_URI RO_URI EXPORT_SIZE\n", argv[0]);
    return 2;
  }
  const char* rw_uri = argv[1];
  const char* ro_uri = argv[2];
  const uint64_t size = strtoull(argv[3], NULL, 10);

  /* A well-behaved client connected the whole time. */
  struct nbd_handle* good = Connect(rw_uri, 1, 1);
  struct nbd_handle* h = Connect(rw_uri, 0, 0);

  static char big[33 << 20];
  char buf[4096];
  memset(buf, 0x11, sizeof buf);

  /* Out of range. */
  ExpectErrno(h, nbd_pread(h, buf, sizeof buf, size - 512, 0), EINVAL, "read crossing the end");
  ExpectErrno(h, nbd_pread(h, buf, 512, UINT64_C(1) << 62, 0), EINVAL, "read far past the end");
  ExpectErrno(h, nbd_pread(h, buf, 512, UINT64_MAX - 100, 0), EINVAL, "read whose end overflows");
  ExpectErrno(h, nbd_pwrite(h, buf, sizeof buf, size - 512, 0), ENOSPC, "write crossing the end");
  ExpectErrno(h, nbd_trim(h, 1 << 20, size, 0), ENOSPC, "trim past the end");
  ExpectErrno(h, nbd_zero(h, 1 << 20, size, 0), ENOSPC, "write_zeroes past the end");

  /* Bad flags. */
  ExpectErrno(h, nbd_pread(h, buf, 512, 0, LIBNBD_CMD_FLAG_NO_HOLE), EINVAL, "read with NO_HOLE");
  ExpectErrno(h, nbd_pwrite(h, buf, 512, 1 << 20, 0x40), EINVAL, "write with unknown flag 0x40");
  /* FUA is valid on every command once negotiated (NBD spec): accepted. */
  CHECK(nbd_flush(h, LIBNBD_CMD_FLAG_FUA) == 0, "flush with FUA refused: %s", nbd_get_error());
  ExpectErrno(h, nbd_pread(h, buf, 512, 0, LIBNBD_CMD_FLAG_FAST_ZERO), EINVAL,
              "read with FAST_ZERO");
  ExpectErrno(h, nbd_trim(h, 4096, 1 << 20, LIBNBD_CMD_FLAG_REQ_ONE), EINVAL, "trim with REQ_ONE");

  /* Zero length and oversize. */
  ExpectErrno(h, nbd_pread(h, buf, 0, 0, 0), EINVAL, "zero-length read");
  ExpectErrno(h, nbd_zero(h, 0, 0, 0), EINVAL, "zero-length write_zeroes");
  ExpectErrno(h, nbd_pread(h, big, sizeof big, 0, 0), EINVAL, "33 MiB read");
  memset(big, 0x77, sizeof big);
  ExpectErrno(h, nbd_pwrite(h, big, sizeof big, 0, 0), EINVAL, "33 MiB write");

  /* Block status without a negotiated metadata context. */
  nbd_extent_callback cb = {.callback = BlockStatusCb};
  ExpectErrno(h, nbd_block_status(h, 4096, 0, cb, 0), EINVAL, "block status without context");

  /* The oversize write's payload was not applied. */
  memset(buf, 0, sizeof buf);
  CHECK(nbd_pread(good, buf, sizeof buf, 1 << 20, 0) == 0, "good read: %s", nbd_get_error());
  CHECK(buf[0] != 0x77, "rejected 33 MiB write changed the disk");

  /* Read-only export: writes are EPERM, reads work. */
  struct nbd_handle* ro = Connect(ro_uri, 0, 0);
  CHECK(nbd_is_read_only(ro) == 1, "read-only export not advertised read-only");
  ExpectErrno(ro, nbd_pwrite(ro, buf, 512, 0, 0), EPERM, "write to read-only");
  ExpectErrno(ro, nbd_trim(ro, 4096, 0, 0), EPERM, "trim on read-only");
  ExpectErrno(ro, nbd_zero(ro, 4096, 0, 0), EPERM, "write_zeroes on read-only");
  ExpectErrno(ro, nbd_pwrite(ro, buf, 512, size + 4096, 0), EPERM, "out-of-range write to read-only");

  /* The well-behaved client never noticed. */
  memset(buf, 0, sizeof buf);
  CHECK(nbd_pread(good, buf, sizeof buf, 8192, 0) == 0, "good client read: %s", nbd_get_error());
  CHECK(buf[0] == 0x5a && buf[4095] == 0x5a, "good client sees wrong data");
  memset(buf, 0x3c, sizeof buf);
  CHECK(nbd_pwrite(good, buf, sizeof buf, 2 << 20, LIBNBD_CMD_FLAG_FUA) == 0, "good write: %s",
        nbd_get_error());
  memset(buf, 0, sizeof buf);
  CHECK(nbd_pread(h, buf, sizeof buf, 2 << 20, 0) == 0 && buf[100] == 0x3c,
        "hostile handle cannot see the good client's write");

  nbd_shutdown(ro, 0);
  nbd_close(ro);
  nbd_shutdown(h, 0);
  nbd_close(h);
  nbd_shutdown(good, 0);
  nbd_close(good);
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
