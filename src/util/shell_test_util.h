// Shell: runs a command line through /bin/sh for tests that judge thindisk
// with outside tools (qemu-img, rados, ...), capturing stdout and stderr.
//
// Header-only, for tests of any layer.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace thindisk::test_env {

struct RunResult {
  int exit_code = -1;  // -1: could not run, or killed by a signal
  std::string output;  // stdout and stderr
};

inline RunResult Shell(const std::string& cmd) {
  RunResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace thindisk::test_env
