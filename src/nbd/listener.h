// Listening sockets for the NBD server: Unix, TCP, and systemd-style socket
// activation. Each returns a listening descriptor (close-on-exec) that the
// caller owns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/result.h"

namespace thindisk::nbd {

// The IANA port for NBD.
inline constexpr uint16_t kDefaultNbdPort = 10809;

// Binds and listens on a Unix socket at `path`. A stale socket file at the
// path is replaced; any other existing file is kInvalidArgument. The file
// appears only once the socket listens (it is bound under a name of its own
// beside `path`, then renamed), so a client that finds it is never refused.
// `mode` (e.g. 0600), when not 0, is set before anyone can connect.
struct UnixListenOptions {
  unsigned mode = 0;
  int backlog = 128;
};
Result<int> ListenUnix(const std::string& path, UnixListenOptions options = {});

// Binds and listens on every address `host` resolves to, returning the
// first that works (port 0: the kernel picks; see BoundPort).
Result<int> ListenTcp(const std::string& host, uint16_t port);

// The local port a TCP listener is bound to.
Result<uint16_t> BoundPort(int fd);

// Who is at the other end of a connected socket, for log lines:
// "127.0.0.1:40312", "[::1]:40312", "unix socket (pid 812, uid 0)", or
// "fd 5" when `fd` is no socket (stdio on pipes) or says nothing more.
std::string DescribePeer(int fd);

// Socket activation: when LISTEN_PID is this process, the LISTEN_FDS
// descriptors starting at 3. Empty when the process was not activated.
// Clears the variables so child processes do not inherit them.
Result<std::vector<int>> SocketActivationFds();

}  // namespace thindisk::nbd
