#!/usr/bin/env bash
# tests/serve/random_ops.sh with thindisk's image in the test cluster's pool
# (issue 14): the same seeded writes, zeroes and discards through `thindisk
# serve rados://...`, with objects of 64 KiB (or one cluster) so that
# requests and the discards' punched runs cross object boundaries; the
# snapshot, the grow and every compare against qemu's qcow2 driver and the
# raw model as there. Needs the test cluster (CEPH_CONF; ctest starts it:
# tests/ceph/fixture.sh).
RANDOM_OPS_POOL=thindisk exec bash "$(dirname "$0")/../serve/random_ops.sh"
