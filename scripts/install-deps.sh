#!/usr/bin/env bash
# Installs everything needed to build, test and demo thindisk on Debian 12.
# Run as root (or with sudo available). Always refreshes the package lists:
# CI machines start with stale ones, and the update is quick when nothing changed.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential g++ cmake ninja-build pkg-config git clang
  # clang's sanitizer and libFuzzer runtimes (a Recommends, which --no-install-recommends skips)
  libclang-rt-14-dev
  # libraries
  zlib1g-dev libzstd-dev libcli11-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev libnbd-dev
  # librados: C API (librados-dev) and the C++ one io::RadosStorage uses (libradospp-dev)
  librados-dev libradospp-dev
  # librbd: existing RBD images (rbd:POOL/IMAGE, io::RbdStorage)
  librbd-dev
  # the NBD server's READs through an io_uring ring (src/nbd/async_reads.h)
  liburing-dev
  # TLS on the NBD server (src/nbd/tls*): GnuTLS, and certtool for the tests' throwaway CA
  libgnutls28-dev gnutls-bin
  # the tools our interop tests judge us by (qemu-block-extra: qemu's rbd
  # driver, a module qemu-img --help lists even when it is not installed;
  # bench/rados's qemu-nbd rbd: peer)
  qemu-utils qemu-block-extra libnbd-bin fio nbdkit jq
  # the throwaway one-node Ceph cluster of the RADOS tests (scripts/ceph-cluster.sh):
  # mon and osd daemons, the ceph/rados CLIs (nothing starts them without systemd)
  ceph-mon ceph-osd ceph-common
  # bench/compare and a test script compute with it
  python3
  # tests/interop/backup_durable.sh watches a backup's syncs with it
  strace
  # the filesystem tests (tests/serve/fs_lib.sh): ext4 on a served disk through
  # nbdfuse (libnbd-bin) and a loop device; mkfs/e2fsck/resize2fs, losetup,
  # fstrim, fsfreeze (all of Debian's required set, named for clarity); XFS
  # for serve.filesystem_kill_xfs
  e2fsprogs mount util-linux xfsprogs
  # tests/install: man pages read with man and groff; the installed unit run by
  # systemd-socket-activate and checked by systemd-analyze (no systemd as PID 1 needed)
  man-db groff-base systemd
)

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then
    SUDO=(sudo)
  else
    echo "install-deps.sh: must run as root (or with sudo installed)" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
