#!/usr/bin/env bash
# Backing-chain commands against qemu-img 7.2 on copies of the same chain:
# commit (-d, -b), rebase (safe, -u, -b ""), amend, and map's depth. After
# each operation, qemu-img's result and thindisk's must show the guest the
# same bytes (qemu-img compare), check clean (qemu-img check), carry the
# same backing fields (qemu-img info), and the guest view through the top
# must be what it was before (where the operation promises that).
source "$(dirname "$0")/lib.sh"
require_tool "$QEMU_IMG" "$QEMU_IO" jq cmp
require_thindisk

M=$((1 << 20))

# make_chain DIR OPTS BASEFMT: base (qcow2 or raw) <- mid <- top, written by
# qemu-io, with data, zero-allocated ranges and sub-cluster pieces in every
# layer, overlapping so each layer hides part of the one below.
make_chain() {
  local dir=$1 opts=$2 basefmt=$3
  mkdir -p "$dir"
  ( cd "$dir"
    if [[ $basefmt == raw ]]; then
      ok "$QEMU_IMG" create -f raw base.raw $((8 * M))
      io_ok qemu-io-raw base.raw "write -P 1 0 $((3 * M))" "write -P 9 $((6 * M)) 4096"
    else
      ok "$QEMU_IMG" create -f qcow2 -o "$opts" base.qcow2 $((8 * M))
      io_ok qemu-io base.qcow2 "write -P 1 0 $((3 * M))" "write -P 9 $((6 * M)) 4096"
    fi
    ok "$QEMU_IMG" create -f qcow2 -o "$opts" -b "base.$basefmt" -F "$basefmt" mid.qcow2
    io_ok qemu-io mid.qcow2 "write -P 2 $((1 * M)) $((2 * M))" "write -z $((5 * M)) 65536" \
      "write -P 6 $((6 * M + 8192)) 1024"
    ok "$QEMU_IMG" create -f qcow2 -o "$opts" -b mid.qcow2 -F qcow2 top.qcow2
    io_ok qemu-io top.qcow2 "write -z 0 65536" "write -P 3 $((2 * M)) 65536" \
      "write -P 4 $((7 * M)) 4096" "write -P 5 $((6 * M)) 512" "write -z $((1 * M)) 4096" )
}

# fresh NAME OPTS BASEFMT: chains q/ (for qemu-img), t/ (for thindisk) and
# orig/ (untouched), identical.
fresh() {
  rm -rf q t orig
  make_chain orig "$2" "$3"
  cp -a orig q
  cp -a orig t
  log "$1"
}

same_content() {  # same_content A B WHAT
  capture "$QEMU_IMG" compare "$1" "$2"
  [[ $RC == 0 ]] || fail "$3: $1 and $2 differ: $(cat "$OUT" "$ERR")"
}

# The allocation map without host offsets (they depend on allocation order).
map_shape() {
  ok "$QEMU_IMG" map --output=json "$1"
  jq -c 'map(del(.offset))' "$OUT"
}

backing_fields() {
  ok "$QEMU_IMG" info --output=json "$1"
  jq -c '{b: ."backing-filename", f: ."backing-filename-format"}' "$OUT"
}

# run_layout NAME OPTS BASEFMT WIDEN: every chain operation on one layout.
# WIDEN is the refcount width the amend steps return to from 1 bit: qemu-img
# 7.2 takes 18 s (64 KiB clusters) to 77 s (128 KiB) to widen from 1 bit, so
# one layout does it and the others return to 1 bit's width (16 to 64 widens
# in every layout).
run_layout() {
  local name=$1 opts=$2 basefmt=$3 widen=$4 base="base.$3"

  fresh "$name: map agrees with qemu-img map (depth per extent)" "$opts" "$basefmt"
  ok "$QEMU_IMG" map --output=json orig/top.qcow2
  cp "$OUT" qemu-map.json
  td map --output=json orig/top.qcow2
  # qemu-img 7.2 gives a host offset for unallocated subclusters of an
  # allocated cluster at the bottom of the chain (present: false); thindisk
  # does not. Everything else must match exactly.
  local norm='map(if .present then . else del(.offset) end)
    | reduce .[] as $e ([]; if length > 0 and .[-1].offset == null and $e.offset == null
        and (.[-1] | del(.start, .length)) == ($e | del(.start, .length))
        and .[-1].start + .[-1].length == $e.start
      then .[-1].length += $e.length else . + [$e] end)'
  [[ "$(jq -c "$norm" qemu-map.json)" == "$(jq -c "$norm" "$OUT")" ]] ||
    fail "$name: map --output=json differs from qemu-img map: $(diff qemu-map.json "$OUT")"
  [[ $(jq '[.[].depth] | max' qemu-map.json) == 2 ]] || fail "$name: chain has no depth-2 extent"
  td map orig/top.qcow2
  grep -q "orig/mid.qcow2" "$OUT" || fail "$name: human map names no layer file: $(cat "$OUT")"

  fresh "$name: commit (empties the overlay)" "$opts" "$basefmt"
  ok "$QEMU_IMG" commit q/top.qcow2
  td commit t/top.qcow2
  grep -q "Image committed." "$OUT" || fail "$name: commit printed no confirmation"
  same_content q/mid.qcow2 t/mid.qcow2 "$name commit: mid"
  same_content orig/top.qcow2 t/top.qcow2 "$name commit: guest view"
  same_content q/top.qcow2 t/top.qcow2 "$name commit: top"
  qemu_check t/top.qcow2 t/mid.qcow2
  [[ $(map_shape t/top.qcow2 | jq '[.[] | select(.depth == 0)] | length') == 0 ]] ||
    fail "$name commit: the overlay still stores data: $(map_shape t/top.qcow2)"

  fresh "$name: commit -d -p (keeps the overlay)" "$opts" "$basefmt"
  local own='[.[] | select(.depth == 0)]' before
  before=$(map_shape t/top.qcow2 | jq -c "$own")
  ok "$QEMU_IMG" commit -d q/top.qcow2
  td commit -d -p t/top.qcow2
  same_content q/mid.qcow2 t/mid.qcow2 "$name commit -d: mid"
  [[ "$(map_shape t/top.qcow2 | jq -c "$own")" == "$before" ]] ||
    fail "$name commit -d: the overlay changed"
  qemu_check t/top.qcow2 t/mid.qcow2

  fresh "$name: commit -b BASE (through the middle layer)" "$opts" "$basefmt"
  ok "$QEMU_IMG" commit -b "$base" q/top.qcow2
  td commit -b "$base" t/top.qcow2
  same_content orig/top.qcow2 "t/$base" "$name commit -b: base holds the top's view"
  same_content "q/$base" "t/$base" "$name commit -b: base"
  same_content orig/top.qcow2 t/top.qcow2 "$name commit -b: top unchanged"
  [[ $basefmt == raw ]] || qemu_check "t/$base"

  fresh "$name: rebase (safe) past the middle layer" "$opts" "$basefmt"
  ok "$QEMU_IMG" rebase -b "$base" -F "$basefmt" q/top.qcow2
  td rebase -b "$base" -F "$basefmt" t/top.qcow2
  same_content orig/top.qcow2 t/top.qcow2 "$name rebase: guest view"
  same_content q/top.qcow2 t/top.qcow2 "$name rebase: vs qemu-img"
  assert_eq "$(backing_fields q/top.qcow2)" "$(backing_fields t/top.qcow2)" "$name rebase: backing"
  qemu_check t/top.qcow2
  io_ok qemu-io t/top.qcow2 "read -P 3 $((2 * M)) 65536" "read -P 4 $((7 * M)) 4096" \
    "read -P 2 $((1 * M + 4096)) 4096" "read -P 0 0 65536"

  fresh "$name: rebase -b \"\" (flatten)" "$opts" "$basefmt"
  ok "$QEMU_IMG" rebase -b "" q/top.qcow2
  td rebase -b "" t/top.qcow2
  same_content orig/top.qcow2 t/top.qcow2 "$name flatten: guest view"
  assert_eq '{"b":null,"f":null}' "$(backing_fields t/top.qcow2)" "$name flatten: backing"
  rm -f t/mid.qcow2 "t/$base"  # it must stand alone now
  same_content q/top.qcow2 t/top.qcow2 "$name flatten: vs qemu-img"
  qemu_check t/top.qcow2

  fresh "$name: rebase -u" "$opts" "$basefmt"
  ok "$QEMU_IMG" rebase -u -b "$base" -F "$basefmt" q/top.qcow2
  td rebase -u -b "$base" -F "$basefmt" t/top.qcow2
  assert_eq "$(backing_fields q/top.qcow2)" "$(backing_fields t/top.qcow2)" "$name rebase -u"
  same_content q/top.qcow2 t/top.qcow2 "$name rebase -u: vs qemu-img"
  qemu_check t/top.qcow2

  fresh "$name: rebase onto a missing file fails and changes nothing" "$opts" "$basefmt"
  td_fails "missing.qcow2" "$name: rebase onto a missing file" rebase -b missing.qcow2 -F qcow2 t/top.qcow2
  cmp orig/top.qcow2 t/top.qcow2 || fail "$name: failed rebase modified the image"

  fresh "$name: amend" "$opts" "$basefmt"
  local o
  for o in lazy_refcounts=on refcount_bits=64 refcount_bits=1 "lazy_refcounts=off,refcount_bits=$widen" \
           backing_file=mid.qcow2,backing_fmt=qcow2; do
    ok "$QEMU_IMG" amend -o "$o" q/top.qcow2
    td amend -o "$o" t/top.qcow2
    ok "$QEMU_IMG" info --output=json q/top.qcow2
    jq -c '."format-specific".data, ."backing-filename"' "$OUT" >q.info
    ok "$QEMU_IMG" info --output=json t/top.qcow2
    jq -c '."format-specific".data, ."backing-filename"' "$OUT" >t.info
    assert_eq "$(cat q.info)" "$(cat t.info)" "$name amend -o $o: info"
    same_content orig/top.qcow2 t/top.qcow2 "$name amend -o $o: guest view"
    qemu_check t/top.qcow2
  done
}

run_downgrade() {
  fresh "compat=0.10 and back (zero clusters converted)" "cluster_size=65536" qcow2
  ok "$QEMU_IMG" amend -o compat=0.10 q/top.qcow2
  td amend -o compat=0.10 t/top.qcow2
  for f in q t; do
    ok "$QEMU_IMG" info --output=json $f/top.qcow2
    jq -c '."format-specific".data' "$OUT" >$f.info
  done
  assert_eq "$(cat q.info)" "$(cat t.info)" "compat=0.10: info"
  same_content orig/top.qcow2 t/top.qcow2 "compat=0.10: guest view"
  qemu_check t/top.qcow2
  td amend -o compat=1.1 t/top.qcow2
  ok "$QEMU_IMG" amend -o compat=1.1 q/top.qcow2
  ok "$QEMU_IMG" info --output=json t/top.qcow2
  assert_eq '"1.1"' "$(jq -c '."format-specific".data.compat' "$OUT")" "compat=1.1"
  same_content orig/top.qcow2 t/top.qcow2 "compat=1.1: guest view"
  qemu_check t/top.qcow2
}

run_errors() {
  log "clear errors"
  fresh "errors" "cluster_size=65536" qcow2
  expect_error() {  # expect_error PATTERN ARGS...: thindisk exits 1 with PATTERN on stderr
    td_fails "$1" "thindisk ${*:2}" "${@:2}"
  }
  ok "$QEMU_IMG" create -f qcow2 other.qcow2 $((8 * M))
  expect_error "Did not find" commit -b missing.qcow2 t/top.qcow2
  expect_error "Did not find" commit -b other.qcow2 t/top.qcow2
  expect_error "does not have a backing file" commit other.qcow2
  expect_error "cluster_size.*created" amend -o cluster_size=4096 t/top.qcow2
  expect_error "extended_l2.*created" amend -o extended_l2=on t/top.qcow2
  expect_error "Invalid parameter 'foo'" amend -o foo=bar t/top.qcow2
  ok "$QEMU_IMG" create -f raw r.raw $M
  expect_error "raw.*amendment" amend -f raw -o compat=1.1 r.raw
  expect_error "requires refcount_bits=16" amend -o compat=0.10,refcount_bits=8 t/top.qcow2
  expect_error "Lazy refcounts" amend -o compat=0.10,lazy_refcounts=on t/top.qcow2
  ok "$QEMU_IMG" create -f qcow2 -o extended_l2=on,cluster_size=131072 xl2.qcow2 $M
  expect_error "extended L2" amend -o compat=0.10 xl2.qcow2
  expect_error "backing format must be specified" rebase -u -b base.qcow2 t/top.qcow2
  cmp orig/top.qcow2 t/top.qcow2 || fail "a failed command modified the image"
}

run_layout "64K no-xl2" "cluster_size=65536,extended_l2=off" qcow2 16
run_layout "default (128K xl2 zstd)" "cluster_size=131072,extended_l2=on,compression_type=zstd" qcow2 1
run_layout "raw base" "cluster_size=65536" raw 1
run_downgrade
run_errors
log "all chain operations agree with qemu-img"
