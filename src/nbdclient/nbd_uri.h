// Telling NBD URIs from file names, wherever an image name is taken.
//
// An image name may be a host file or an NBD export written as qemu writes
// it (docs: qemu "nbd" protocol; libnbd's nbd_connect_uri reads the same):
//   nbd://HOST[:PORT]/EXPORT          TCP
//   nbd+unix:///EXPORT?socket=PATH    Unix domain socket
//   nbds://..., nbds+unix://...       the same over TLS (libnbd does TLS)
// The export is a byte store (a "protocol" in qemu's terms); the image
// format (raw or qcow2) is probed or given on top of it, as for a file.
//
// Only the scheme is looked at here; libnbd parses and validates the rest
// when connecting, and its message is what the user sees.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace thindisk::nbdclient {

// Whether `name` starts with one of the four NBD schemes above.
bool IsNbdUri(std::string_view name);

// The scheme of a name shaped like a URI ("nbdx" for "nbdx://a/b"): letters,
// digits, '+', '-', '.' after a leading letter, then "://". Empty when
// `name` does not look like a URI (an ordinary file name).
std::string UriScheme(std::string_view name);

// "NAME: unknown protocol 'nbdx' (images are files, nbd://, nbd+unix://,
// nbds://, nbds+unix:// URIs or rados://POOL/IMAGE)", for a URI-shaped name
// that is no file.
std::string UnknownProtocolMessage(std::string_view name);

}  // namespace thindisk::nbdclient
