#!/usr/bin/env bash
# Clang's thread-safety analysis holds the lock contracts
# (util/thread_annotations.h): thread_annotations_cases.cc compiles with the
# contract kept and each way of breaking it is rejected with its own
# diagnostic; then the libraries whose locks are annotated pass the
# analysis (the release and sanitizer builds use g++, which ignores the
# attributes). Needs clang (CI has it: the fuzz pass builds with it).
#
#   thread_annotations_test.sh [--dir DIR SOURCE...]...
#     each SOURCE (relative to the DIR before it) is analysed; CMake passes
#     the sources of the annotated libraries (src/util/CMakeLists.txt)
#   THINDISK_CLANGXX   the clang++ to use (default: clang++-14, clang++)
source "$(dirname "$0")/../../tests/lib/common.sh"

here=$(cd "$(dirname "$0")" && pwd)
src=$(dirname "$here")
cxx=${THINDISK_CLANGXX:-}
if [[ -z $cxx ]]; then
  cxx=$(command -v clang++-14 || command -v clang++ || true)
fi
[[ -n $cxx ]] || skip_or_fail "required tool not found: clang++"

# Syntax only (no code), with the warnings of the build and the analysis.
flags=(-std=c++20 -fsyntax-only -Wall -Wextra -Wthread-safety -Werror -I"$src")

# compile CASE: the compiler's diagnostics; its status in $rc.
compile() {
  rc=0
  out=$("$cxx" "${flags[@]}" -DCASE="$1" "$here/thread_annotations_cases.cc" 2>&1) || rc=$?
}

compile 0
((rc == 0)) || fail "the contract kept does not compile: $out"
log "case 0 (contract kept): compiles"

expect=(
  ""
  "reading variable 'n_' requires holding mutex 'mu_'"
  "calling function 'AddLocked' requires holding mutex 'mu_' exclusively"
  "mutex 'mu_' is not held on every path through here"
  "writing variable 'n_' requires holding mutex 'mu_' exclusively"
  "no member named 'lock'"
  "writing variable 'n_' requires holding mutex 'mu_' exclusively"
)
for c in 1 2 3 4 5 6; do
  compile "$c"
  ((rc != 0)) || fail "case $c compiled: the analysis missed a broken contract"
  [[ $out == *"${expect[$c]}"* ]] ||
    fail "case $c was rejected, but not for '${expect[$c]}': $out"
  log "case $c: rejected ('${expect[$c]}')"
done

# The annotated libraries, each source on its own; a rejected one is named
# with the compiler's first lines about it.
sources=()
dir=.
while (($#)); do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    *.cc) [[ $1 == /* ]] && sources+=("$1") || sources+=("$dir/$1"); shift ;;
    *) shift ;;
  esac
done
((${#sources[@]} == 0)) && exit 0
failed=$(printf '%s\0' "${sources[@]}" | xargs -0 -P "$(nproc)" -I{} sh -c \
  'file=$1; shift; out=$("$@" "$file" 2>&1) || { echo "== $file"; echo "$out" | head -20; }' \
  sh {} "$cxx" "${flags[@]}")
[[ -z $failed ]] || fail "the analysis rejects annotated sources:
$failed"
log "${#sources[@]} sources of the annotated libraries pass the analysis"
