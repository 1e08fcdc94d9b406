// Changing the refcount width (refcount_bits) of a closed qcow2 image, for
// `amend -o refcount_bits=N`.
//
// Every cluster's refcount is read from the current structures and written
// into a new refcount table and new blocks of the new width, placed past the
// end of the file (nothing the current header points at is touched). After a
// sync, one atomic header write switches to them (qcow2/header_update.h);
// the old table and blocks are then free clusters and are punched. A crash
// before the switch leaves the old, intact structures (the new ones are
// unreferenced space past what they count); after it, the new ones.
//
// REQUIRES: nothing has the image open for writing; the image is version 3
// (version 2 knows only 16-bit refcounts) and not dirty.
// Errors: kInvalidArgument for a width that is not a power of two <= 64 or
// a refcount that does not fit the new width (naming the cluster);
// kCorrupt for malformed refcount structures; storage errors.
#pragma once

#include <cstdint>

#include "io/storage.h"
#include "util/status.h"

namespace thindisk::qcow2 {

Status ChangeRefcountWidth(io::Storage& storage, uint32_t refcount_bits);

}  // namespace thindisk::qcow2
