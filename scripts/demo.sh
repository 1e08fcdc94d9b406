#!/usr/bin/env bash
# The main job, from a fresh clone: install dependencies, build thindisk, create
# a default thin qcow2 disk (./disk.qcow2, 10 GiB, kept if it already exists),
# show what thindisk and qemu-img think of it, and serve it over NBD on a Unix
# socket (./disk.sock) and 127.0.0.1:10809 until Ctrl-C (or SIGTERM), which
# flushes the disk and marks it clean.
#
# Environment: THINDISK_SKIP_DEPS=1 skips the package install;
# THINDISK_BUILD_DIR (default build) is the build directory; DISK=path and
# SIZE=10G choose the disk; SOCKET=path and PORT=10809 the listeners;
# NO_SERVE=1 stops after the inspection.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
DISK=${DISK:-$ROOT/disk.qcow2}
SIZE=${SIZE:-10G}

if [[ ${THINDISK_SKIP_DEPS:-0} != 1 ]]; then
  bash scripts/install-deps.sh
fi
BUILD=$ROOT/${THINDISK_BUILD_DIR:-build}
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD" -j"${THINDISK_JOBS:-2}" --target thindisk
TD=$BUILD/thindisk
[[ -x $TD ]] || TD=$(find "$BUILD" -name thindisk -type f -perm -u+x | head -n1)

if [[ -e $DISK ]]; then
  echo "== $DISK exists; keeping it"
else
  echo "== thindisk create -f qcow2 $DISK $SIZE"
  "$TD" create -f qcow2 "$DISK" "$SIZE"
fi
echo "== thindisk info $DISK"
"$TD" info "$DISK"
echo "== qemu-img check $DISK"
qemu-img check "$DISK"
echo "== host space used: $(du -h "$DISK" | cut -f1) for a $("$TD" info --output=json "$DISK" | jq -r '."virtual-size"') byte disk"

[[ ${NO_SERVE:-0} == 1 ]] && exit 0
SOCKET=${SOCKET:-$ROOT/disk.sock}
PORT=${PORT:-10809}
echo "== thindisk serve: connect with the URI below (e.g. nbdinfo URI, qemu-io -f raw URI)"
exec "$TD" serve -f qcow2 --socket "$SOCKET" --bind 127.0.0.1 --port "$PORT" "$DISK"
