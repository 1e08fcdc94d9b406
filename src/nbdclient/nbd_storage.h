// nbdclient::OpenNbd: an NBD export as io::Storage, through libnbd.
//
// qemu treats an NBD export as a protocol layer: a fixed-size byte store on
// which the image format (raw or qcow2) is probed or given, and so does
// block::Open with this storage under the format driver. The mapping of
// the Storage contract onto NBD (doc/proto.md of the NBD project):
//  - ReadAt/WriteAt: NBD_CMD_READ/WRITE, split at the server's maximum
//    block size (32 MiB when it does not say), all pieces in flight at once.
//    Bytes past the export's end read as zeros (the contract's sparse tail);
//    a write past it is kNoSpace ("export too small"), since an export
//    cannot grow.
//  - Flush: NBD_CMD_FLUSH when the server offers it (else writes are
//    already as durable as the server makes them).
//  - ZeroRange: NBD_CMD_WRITE_ZEROES with NBD_CMD_FLAG_NO_HOLE; PunchHole:
//    NBD_CMD_WRITE_ZEROES without it (the server may trim; reads return
//    zeros either way, which NBD_CMD_TRIM alone does not promise). A server
//    without WRITE_ZEROES gets zero-filled writes.
//  - NextData/NextHole: the "base:allocation" meta context (requested
//    before connecting); NBD_STATE_HOLE is a hole. A server without it
//    reports everything as data.
//  - Size: the export size; Resize to any other size is kNotSupported (an
//    export has the size the server gives it, as for qemu-img resize);
//    Allocate is kNotSupported; AllocatedBytes is 0 (unknown).
//  - Read-only exports (or read_only opens): writes are kReadOnly naming the
//    URI.
//  - A server's minimum block size (NBD_INFO_BLOCK_SIZE; up to 64 KiB) is
//    met here: smaller or unaligned reads read the whole blocks around
//    them, and such writes and zeroes read-modify-write their partial
//    blocks while no other write runs (the qcow2 engine writes 8-byte
//    table entries).
//
// Concurrency: calls from any number of threads issue nbd_aio_* commands
// and sleep until their own completion (nbdclient/connection.h), so many
// requests are in flight at once. When the server offers multi-conn, up to
// four connections carry them, round robin: the first is made by OpenNbd,
// the others once requests overlap (so info or map, asking one thing at a
// time, make one), joining in the background when the server takes them (a
// server that accepts fewer connections than it advertises just gets
// fewer); a flush on one covers writes completed on all, as multi-conn
// promises. When
// a connection dies (the server went away), its waiting and later requests
// fail with libnbd's message.
//
// Errors: one line naming the URI: "nbd+unix:///x?socket=/s: <libnbd or
// server error>", with codes from the errno (ENOENT -> kNotFound, ...).
#pragma once

#include <memory>
#include <string>

#include "io/storage.h"
#include "util/result.h"

namespace thindisk::nbdclient {

// Connects to the export `uri` (see nbdclient/nbd_uri.h for the syntax).
// `read_only` opens refuse every write without asking the server.
Result<std::unique_ptr<io::Storage>> OpenNbd(const std::string& uri, bool read_only);

}  // namespace thindisk::nbdclient
