#!/usr/bin/env bash
# Bad input to every subcommand: one line "thindisk: ..." on stderr, a
# non-zero exit that is not a crash, no partial output file, and the source
# image unchanged (checksum before and after).
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" sha256sum
require_thindisk

# A valid source with data, made by qemu so no thindisk bug can hide here.
ok "$QEMU_IMG" create -q -f qcow2 src.qcow2 4M
ok "$QEMU_IO" -c "write -P 0x5a 0 64k" -c "write -P 0xa5 1M 4k" src.qcow2
ok "$QEMU_IMG" create -q -f raw src.raw 1M
# A clone of it, for the backing loops below.
ok "$QEMU_IMG" create -q -f qcow2 -b src.qcow2 -F qcow2 clone.qcow2
ok "$QEMU_IO" -c "write -P 0x3c 2M 64k" clone.qcow2
SUM_BEFORE=$(sha256sum src.qcow2 src.raw clone.qcow2)
CASES=0

# bad CASE_NAME OUTPUT_OR_- ARGS...: `thindisk ARGS` must fail cleanly and
# must leave no OUTPUT behind.
bad() {
  local what=$1 output=$2
  shift 2
  CASES=$((CASES + 1))
  capture "$TD" "$@"
  local lines
  lines=$(grep -c . "$ERR" || true)
  if [[ $RC -eq 0 ]]; then
    fail "$what: 'thindisk $*' succeeded (stdout: $(head -c 300 "$OUT"))"
  fi
  if [[ $RC -ge 128 ]]; then
    fail "$what: 'thindisk $*' crashed (exit $RC): $(cat "$ERR")"
  fi
  if [[ $lines -ne 1 ]] || ! grep -q '^thindisk: ..' "$ERR"; then
    sed 's/^/  stderr: /' "$ERR" >&2
    fail "$what: 'thindisk $*' must print exactly one 'thindisk: ...' line on stderr (got $lines lines)"
  fi
  if [[ $output != - ]]; then
    assert_absent "$output" "$what: partial output left by 'thindisk $*'"
  fi
  assert_eq "$SUM_BEFORE" "$(sha256sum src.qcow2 src.raw clone.qcow2)" \
    "$what: source changed by 'thindisk $*'"
  echo "ok: $what: $(cat "$ERR")"
}

# create
bad "create: bad size suffix" out.qcow2 create -f qcow2 out.qcow2 10Q
bad "create: size past 2^64" out.qcow2 create -f qcow2 out.qcow2 16E
bad "create: negative size" out.qcow2 create -f qcow2 out.qcow2 -- -1G
bad "create: missing size" out.qcow2 create -f qcow2 out.qcow2
bad "create: bad -o key" out.qcow2 create -f qcow2 -o no_such_key=1 out.qcow2 1G
bad "create: bad cluster size" out.qcow2 create -f qcow2 -o cluster_size=3000 out.qcow2 1G
bad "create: extended_l2 with 4k clusters" out.qcow2 \
  create -f qcow2 -o cluster_size=4096,extended_l2=on out.qcow2 1G
bad "create: zstd with compat 0.10" out.qcow2 \
  create -f qcow2 -o compat=0.10,compression_type=zstd out.qcow2 1G
bad "create: unknown format" out.img create -f nosuchformat out.img 1G
bad "create: missing backing file" out.qcow2 create -f qcow2 -b missing.qcow2 -F qcow2 out.qcow2
bad "create: directory does not exist" - create -f qcow2 no/such/dir/out.qcow2 1G
# Backing loops: creating truncates, so the image's data would be lost.
bad "create: over itself as its backing file" - create -f qcow2 -b clone.qcow2 -F qcow2 clone.qcow2
bad "create -u: over itself as its backing file" - \
  create -f qcow2 -u -b clone.qcow2 -F qcow2 clone.qcow2 4M
bad "create: under a clone of itself" - create -f qcow2 -b clone.qcow2 -F qcow2 src.qcow2

# rebase, amend and convert -B into a backing loop
bad "rebase -u: onto itself" - rebase -u -b clone.qcow2 -F qcow2 clone.qcow2
bad "rebase -u: under a clone of itself" - rebase -u -b clone.qcow2 -F qcow2 src.qcow2
bad "rebase: under a clone of itself" - rebase -b clone.qcow2 -F qcow2 src.qcow2
bad "amend: backing_file a clone of itself" - \
  amend -o backing_file=clone.qcow2,backing_fmt=qcow2 src.qcow2
bad "convert -B: the target as its own backing file" - \
  convert -O qcow2 -B src.qcow2 -F qcow2 clone.qcow2 src.qcow2

# Copying onto the source's own backing file would destroy what the copy
# reads; with -U no lock stands in the way (qemu-img's lock error was all
# that did before, and with -U the base was truncated and lost).
bad "convert -U: onto the source's backing file" - convert -U -O qcow2 clone.qcow2 src.qcow2
bad "convert -U -n: into the source's backing file" - convert -U -n -O qcow2 clone.qcow2 src.qcow2
bad "convert: onto the source's backing file, by another name" - \
  convert -O raw clone.qcow2 ./src.qcow2
bad "dd -U: onto the input's backing file" - dd -U -O qcow2 if=clone.qcow2 of=src.qcow2

# info
bad "info: missing file" - info missing.qcow2
bad "info: unknown format" - info -f nosuchformat src.qcow2
bad "info: wrong format" - info -f qcow2 src.raw
bad "info: bad output format" - info --output=xml src.qcow2

# map
bad "map: missing file" - map missing.qcow2
bad "map: unknown format" - map -f nosuchformat src.qcow2
bad "map: bad output format" - map --output=xml src.qcow2

# check
bad "check: missing file" - check missing.qcow2
bad "check: unknown format" - check -f nosuchformat src.qcow2
bad "check: bad repair mode" - check -r sometimes src.qcow2

# convert
bad "convert: missing source" out.qcow2 convert -O qcow2 missing.qcow2 out.qcow2
bad "convert: unknown output format" out.img convert -O nosuchformat src.qcow2 out.img
bad "convert: unknown input format" out.qcow2 convert -f nosuchformat -O qcow2 src.qcow2 out.qcow2
bad "convert: bad -o key" out.qcow2 convert -O qcow2 -o no_such_key=1 src.qcow2 out.qcow2
bad "convert: bad cluster size" out.qcow2 convert -O qcow2 -o cluster_size=3000 src.qcow2 out.qcow2
bad "convert: bad -o value" out.qcow2 convert -O qcow2 -o extended_l2=maybe src.qcow2 out.qcow2
bad "convert: output directory missing" - convert -O raw src.qcow2 no/such/dir/out.raw

# compare
bad "compare: missing first file" - compare missing.qcow2 src.qcow2
bad "compare: missing second file" - compare src.qcow2 missing.qcow2
bad "compare: unknown format" - compare -f nosuchformat src.qcow2 src.qcow2

# io
bad "io: missing file" - io -c "read 0 4k" missing.qcow2
bad "io: unknown command" - io -c "frobnicate 0 4k" src.qcow2
bad "io: bad size suffix" - io -c "read 0 4Q" src.qcow2
bad "io: read past the end" - io -c "read 0 1T" src.qcow2
bad "io: write past the end" - io -c "write -P 0x11 4M 4k" src.qcow2
bad "io: bad pattern" - io -c "write -P zz 0 4k" src.qcow2
bad "io: unknown format" - io -f nosuchformat -c "read 0 4k" src.qcow2

# no subcommand / unknown subcommand / unknown flag
bad "no subcommand" -
bad "unknown subcommand" - frobnicate src.qcow2
bad "unknown flag" - info --no-such-flag src.qcow2

ok "$QEMU_IMG" check -q src.qcow2
echo "PASS [$TEST_NAME]: $CASES bad invocations"
