/* test_client.h: what the C test clients of tests/serve share
 * (crash_client.c, hostile_client.c, hostile_scale_client.c,
 * stress_client.c). Each client is one translation unit that includes this
 * once, so everything here is static: no library to link, and the failure
 * counter belongs to the client. Not thread-safe (the clients are
 * single-threaded). */
#ifndef THINDISK_TESTS_SERVE_TEST_CLIENT_H_
#define THINDISK_TESTS_SERVE_TEST_CLIENT_H_

#include <fcntl.h>
#include <libnbd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* CHECK(cond, fmt, ...): a failed check is printed and counted in
 * `failures`, and the run goes on, so one run reports every failed check;
 * the client exits non-zero when failures > 0. (Unused by clients that
 * stop at the first error.) */
static int failures __attribute__((unused)) = 0;
#define CHECK(cond, ...)                     \
  do {                                       \
    if (!(cond)) {                           \
      fprintf(stderr, "FAIL: " __VA_ARGS__); \
      fprintf(stderr, "\n");                 \
      failures++;                            \
    }                                        \
  } while (0)

/* A libnbd handle connected to URI, asking for the base:allocation
 * metadata context first when `base_allocation` is set. When that fails
 * there is nothing to test: prints "connect URI: why" and exits 1. */
static inline struct nbd_handle* ConnectOrExit(const char* uri, int base_allocation) {
  struct nbd_handle* h = nbd_create();
  if (h == NULL ||
      (base_allocation && nbd_add_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1) ||
      nbd_connect_uri(h, uri) == -1) {
    fprintf(stderr, "connect %s: %s\n", uri, nbd_get_error());
    exit(1);
  }
  return h;
}

/* splitmix64: advances *state and returns its next value. The clients'
 * workloads follow a seed with it, so a seed names one run on any host. */
static inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* Creates PATH (empty): how a client tells its script it is connected. */
static inline void TouchFile(const char* path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
}

#endif /* THINDISK_TESTS_SERVE_TEST_CLIENT_H_ */
