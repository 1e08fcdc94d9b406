# shellcheck shell=bash
# Helpers for the module tests (tests/ceph/module.sh,
# tests/interop/nbd_module.sh, tests/interop/tls_module.sh): thindisk's
# modules are loaded on demand
# (src/util/module_loader.h). Source after tests/interop/lib.sh (td_fails,
# fail, $TMP, $OUT, $ERR).

# linked_by_module_only MODULE BINARY_RE MODULE_RE: `ldd` of the binary
# ($TD) shows no library matching BINARY_RE, and MODULE's shows one
# matching MODULE_RE.
linked_by_module_only() {
  local module=$1 binary_re=$2 module_re=$3 libs
  # Captured first: under pipefail, `ldd | grep -q` fails whenever grep's
  # early exit gives ldd a SIGPIPE.
  libs=$(ldd "$TD")
  if grep -E "$binary_re" <<<"$libs"; then
    fail "$TD links what its module $(basename "$module") is for"
  fi
  libs=$(ldd "$module")
  grep -qE "$module_re" <<<"$libs" || fail "$module does not link $module_re: $libs"
}

# loaded OBJECT CMD...: runs CMD under LD_DEBUG=files (stderr to $ERR),
# which must succeed, and says whether glibc loaded an object whose path
# contains OBJECT. The whole log is left in $TMP/ldlog.
loaded() {
  local object=$1 rc=0
  shift
  LD_DEBUG=files LD_DEBUG_OUTPUT=$TMP/ld "$@" >"$OUT" 2>"$ERR" || rc=$?
  ((rc == 0)) || fail "exit $rc from: $* ($(cat "$ERR"))"
  cat "$TMP"/ld.* >"$TMP/ldlog" 2>/dev/null || true
  rm -f "$TMP"/ld.*
  grep -q "file=[^ ]*$object" "$TMP/ldlog"
}

# local_work_skips FILE LIBRARY: create, io, convert, info, check and map
# of local images (local.qcow2 with 0x5a at 1M-4M, and copy.qcow2, made
# here) load neither the module FILE nor LIBRARY, and the copy has the same
# bytes.
local_work_skips() {
  local file=$1 library=$2 cmd
  td create -f qcow2 local.qcow2 64M
  for cmd in "io -c 'write -P 0x5a 1M 3M' local.qcow2" "info local.qcow2" \
             "convert -O qcow2 local.qcow2 copy.qcow2" "check copy.qcow2" "map copy.qcow2"; do
    if eval loaded "$file" '"$TD"' "$cmd"; then fail "thindisk $cmd loaded $file"; fi
    if grep -q "$library" "$TMP/ldlog"; then fail "thindisk $cmd loaded $library"; fi
  done
  ok "$QEMU_IMG" compare local.qcow2 copy.qcow2
}

# refuses_broken_modules MODULE KIND ENTRY FIELDS SONAME HINT ARGS...:
# `thindisk ARGS` must fail with exit 1 and the loader's message when
# THINDISK_MODULE_DIR holds, under MODULE's file name:
#   - a file that is not an ELF object;
#   - a library that is not a thindisk module (the binary's libz);
#   - a module of another build: a stand-in compiled here whose entry
#     answers a layout of FIELDS uint32 fields with ABI 999;
#   - MODULE itself asking for SONAME with its last digit made 9 (the same
#     length, so the ELF stays whole): a library no host has, so the error
#     names HINT, the packages to install.
# KIND and ENTRY are the module's words in the errors ("Ceph",
# "thindisk_ceph_module"). The caller checks that nothing changed.
refuses_broken_modules() {
  local module=$1 kind=$2 entry=$3 fields=$4 soname=$5 hint=$6
  shift 6
  local file missing
  file=$(basename "$module")
  missing="${soname%?}9"
  mkdir -p notelf notours other nolib
  echo "not a library" >notelf/"$file"
  cp "$(ldd "$TD" | awk '/libz\.so/ { print $3 }')" notours/"$file"
  THINDISK_MODULE_DIR=$TMP/notelf td_fails \
    "$kind support cannot be loaded: $TMP/notelf/$file: [a-z]" \
    "$kind: a module file that is not an ELF object" "$@"
  THINDISK_MODULE_DIR=$TMP/notours td_fails \
    "$TMP/notours/$file: not a thindisk $kind module \(no $entry\)" \
    "$kind: a library that is not the module" "$@"
  cat >other.c <<EOC
struct layout { unsigned field[$fields]; };
const void* $entry(const struct layout* caller, struct layout* own) {
  *own = *caller;
  own->field[0] = 999;
  return 0;
}
EOC
  cc -shared -fPIC -o other/"$file" other.c || fail "cc could not build the stand-in module"
  THINDISK_MODULE_DIR=$TMP/other td_fails \
    "$TMP/other/$file: the $kind module of another thindisk build \(ABI 999, table [0-9]+ bytes; this one needs ABI [0-9]+, table [0-9]+ bytes\)" \
    "$kind: a module of another build" "$@"
  LC_ALL=C sed "s/${soname//./\\.}/$missing/g" "$module" >nolib/"$file"
  grep -qF "$missing" <(ldd nolib/"$file") || fail "the rewritten module still asks for $soname"
  THINDISK_MODULE_DIR=$TMP/nolib td_fails \
    "$kind support cannot be loaded: ${missing//./\\.}: .*\($hint\)" \
    "$kind: a module whose $soname is missing" "$@"
}
