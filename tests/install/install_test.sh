#!/usr/bin/env bash
# `cmake --install` of the already-built tree, judged as an operator meets it
# (dist/CMakeLists.txt is the layout):
#   1. the binary, and nothing else in bin/ (no test or bench programs);
#      its Ceph, NBD client and TLS modules under lib*/thindisk/, which the
#      installed binary loads from there (LD_DEBUG=files) when a rados://
#      name, an NBD URI or a TLS server needs them, and without which it
#      never looks into the build tree;
#   2. a man page per subcommand `thindisk --help` lists, plus thindisk(1),
#      each formatting without a groff warning, found by man(1) under the
#      prefix, and naming every option SUB --help prints;
#   3. the systemd units, naming PREFIX/bin/thindisk (also with DESTDIR);
#      systemd-analyze verify accepts them when it can run here;
#   4. the installed service's ExecStart, expanded as systemd would (%i,
#      Environment=, the EnvironmentFile's IMAGE and SERVE_ARGS), started by
#      systemd-socket-activate on a Unix socket: nbdinfo reads the image's
#      size through it, and SIGTERM stops it with exit status 0.
#
# Environment (tests/CMakeLists.txt): THINDISK (the built binary),
# THINDISK_BUILD_DIR (the tree to install), CMAKE (the cmake to run).
# Exit codes: 0 pass, 1 fail, 77 skipped (a missing tool; fails under CI).
# shellcheck source=../lib/common.sh
source "$(dirname "$0")/../lib/common.sh"

require_thindisk
require_tool nbdinfo systemd-socket-activate man groff
BUILD_DIR=${THINDISK_BUILD_DIR:?THINDISK_BUILD_DIR: the build tree to install}
CMAKE=${CMAKE:-cmake}
require_tool "$CMAKE"
enter_temp_dir td-install

# ---- 1. Install; the binary ----------------------------------------------
PREFIX=$TMP/x
log "cmake --install $BUILD_DIR --prefix $PREFIX"
"$CMAKE" --install "$BUILD_DIR" --prefix "$PREFIX" >install.log 2>&1 ||
  { cat install.log >&2; fail "cmake --install failed"; }
BIN=$PREFIX/bin/thindisk
[[ -x $BIN ]] || fail "no executable $BIN"
cmp -s "$BIN" "$TD" || fail "$BIN differs from the built $TD"
assert_eq "thindisk" "$(find "$PREFIX/bin" -mindepth 1 -printf '%f\n')" "the programs installed in bin/"
VERSION=$("$BIN" --version | awk '{ print $NF }')
[[ -n $VERSION ]] || fail "$BIN --version printed no version"

# installed_module FILE KIND RAN ARGS...: the module FILE is installed
# once, under lib*/thindisk/ (util/module_loader.h), and `thindisk ARGS`
# (which must fail: nothing is there to reach) loads it from there, its
# error matching RAN, which only the module's code says. Without it the
# installed binary says so (KIND's words) and never falls back on the
# build tree's module (a build under /tmp would let anyone plant one).
installed_module() {
  local file=$1 kind=$2 ran=$3 module
  shift 3
  module=$(find "$PREFIX" -name "$file")
  [[ $module == "$PREFIX"/lib*/thindisk/"$file" ]] ||
    fail "want one lib*/thindisk/$file under $PREFIX, found: ${module:-none}"
  LD_DEBUG=files LD_DEBUG_OUTPUT=$TMP/ld "$BIN" "$@" >module.out 2>module.err &&
    fail "thindisk $* succeeded"
  grep -q "$ran" module.err || fail "the $kind module did not run: $(cat module.err)"
  grep -q "file=$module " "$TMP"/ld.* || fail "$BIN did not load $module: $(grep -h "$file" "$TMP"/ld.*)"
  rm -f "$TMP"/ld.*
  mv "$module" "$module.off"
  "$BIN" "$@" >module.out 2>module.err && fail "thindisk $* without the installed module succeeded"
  grep -qF "$kind support is not installed: no $file (looked for $module, " module.err ||
    fail "without its $kind module: $(cat module.err)"
  ! grep -F "$BUILD_DIR" module.err || fail "the installed binary looked into the build tree"
  mv "$module.off" "$module"
}
installed_module thindisk-ceph.so Ceph "read ceph.conf ($TMP/none.conf" \
  info "rados://p/i?conf=$TMP/none.conf"
installed_module thindisk-nbd.so "NBD client" "connect: No such file or directory" \
  info "nbd+unix:///?socket=$TMP/none.sock"
# A PSK file the module's credential loader rejects.
echo "alice:not-hex" >bad.psk
"$BIN" create -q -f qcow2 tls.qcow2 1M || fail "create with the installed binary"
installed_module thindisk-tls.so TLS "bad.psk:1: expected username:hexkey" \
  serve --tls-psk "$TMP/bad.psk" -k "$TMP/tls.sock" tls.qcow2

# ---- 2. Man pages -----------------------------------------------------------
MANDIR=$PREFIX/share/man/man1
SUBS=$("$BIN" --help | awk '/^Subcommands:$/ { on = 1; next } on && /^$/ { on = 0 }
                            on && /^  [a-z]/ { print $1 }')
[[ -n $SUBS ]] || fail "$BIN --help lists no subcommands"
want=$( { echo thindisk.1; for s in $SUBS; do echo "thindisk-$s.1"; done; } | sort)
got=$(find "$MANDIR" -mindepth 1 -printf '%f\n' | sort)
assert_eq "$want" "$got" "the pages in $MANDIR (one per subcommand of thindisk --help)"

# render PAGE: page.txt becomes the page as man(1) shows it in 80 columns,
# dashes in ASCII and runs of blanks one space (wrapped text as printed).
render() {
  MANWIDTH=80 env -u MAN_KEEP_FORMATTING man -l "$1" 2>man.err |
    sed 's/\xe2\x80\x90/-/g; s/\xe2\x88\x92/-/g' | tr -s ' \n' '  ' >page.txt ||
    { cat man.err >&2; fail "man -l $1 failed"; }
  [[ ! -s man.err ]] || { cat man.err >&2; fail "man -l $1 printed warnings"; }
}

for page in $got; do
  groff -man -Tutf8 -ww -z "$MANDIR/$page" 2>groff.err ||
    { cat groff.err >&2; fail "groff failed on $page"; }
  [[ ! -s groff.err ]] || { cat groff.err >&2; fail "groff -ww warns on $page"; }
  name=${page%.1}
  sub=${name#thindisk}
  sub=${sub#-}
  if [[ -n $sub ]]; then help=$("$BIN" "$sub" --help); else help=$("$BIN" --help); fi
  render "$MANDIR/$page"
  text=$(<page.txt)
  # The NAME line is the help's first line; the footer carries the version.
  desc=$(head -n1 <<<"$help")
  desc=${desc#thindisk: }
  [[ $text == *"NAME $name - $desc"* ]] || fail "$page: NAME is not '$name - $desc'"
  [[ $text == *"thindisk $VERSION "* ]] || fail "$page: does not carry version $VERSION"
  # Every option of the help's Options: section, as written there.
  flags=$(awk '/^Options:$/ { on = 1; next } on && /^$/ { on = 0 }
               on && /^  -/ { n = split($1, f, ","); for (i = 1; i <= n; i++) print f[i] }' <<<"$help")
  [[ -n $flags ]] || fail "$name --help has no options to look for"
  for f in $flags; do
    [[ $text =~ (^|[ ,])"$f"([ ,]|$) ]] || fail "$page does not show option $f of its --help"
  done
done
# Where man(1) looks: the prefix's share/man.
found=$(MANPATH=$PREFIX/share/man man -w thindisk-serve 2>&1) || fail "man -w thindisk-serve: $found"
assert_eq "$MANDIR/thindisk-serve.1" "$found" "man -w thindisk-serve with MANPATH=$PREFIX/share/man"
echo "man pages: $(wc -w <<<"$got") pages, groff -ww clean, every --help option shown"

# ---- 3. The units -------------------------------------------------------------
UNITS=$PREFIX/lib/systemd/system
SERVICE=$UNITS/thindisk-serve@.service
SOCKET=$UNITS/thindisk-serve@.socket
[[ -f $SERVICE && -f $SOCKET ]] || fail "no thindisk-serve@ units in $UNITS: $(ls "$UNITS" 2>&1)"
! grep -n '@[A-Za-z_]*@' "$SERVICE" || fail "$SERVICE keeps an unsubstituted @VAR@"
exec_start=$(sed -n 's/^ExecStart=//p' "$SERVICE")
[[ $(wc -l <<<"$exec_start") == 1 && -n $exec_start ]] || fail "$SERVICE: want one ExecStart="
assert_eq "$BIN" "${exec_start%% *}" "the program of $SERVICE's ExecStart"
grep -qx 'ListenStream=/run/thindisk/%i.sock' "$SOCKET" || fail "$SOCKET: no ListenStream=/run/thindisk/%i.sock"
grep -qx 'WantedBy=sockets.target' "$SOCKET" || fail "$SOCKET: not WantedBy=sockets.target"

# A packager's install (DESTDIR) names the final path, not the staging one.
log "DESTDIR=$TMP/stage cmake --install --prefix /usr/local"
DESTDIR=$TMP/stage "$CMAKE" --install "$BUILD_DIR" --prefix /usr/local >stage.log 2>&1 ||
  { cat stage.log >&2; fail "cmake --install with DESTDIR failed"; }
staged=$TMP/stage/usr/local/lib/systemd/system/thindisk-serve@.service
grep -qx 'ExecStart=/usr/local/bin/thindisk .*' "$staged" || fail "$staged does not run /usr/local/bin/thindisk"
[[ -x $TMP/stage/usr/local/bin/thindisk ]] || fail "DESTDIR install has no usr/local/bin/thindisk"
for module in thindisk-ceph.so thindisk-nbd.so thindisk-tls.so; do
  compgen -G "$TMP/stage/usr/local/lib*/thindisk/$module" >/dev/null ||
    fail "DESTDIR install has no usr/local/lib*/thindisk/$module"
done
rm -rf "$TMP/stage"

# systemd-analyze verify, where it works without systemd as PID 1: probed
# first on a trivial unit; if that fails, it cannot judge ours here.
mkdir verify
printf '[Service]\nExecStart=/bin/true\n' >verify/td-probe.service
if command -v systemd-analyze >/dev/null &&
   systemd-analyze verify --man=no verify/td-probe.service >probe.out 2>&1 && [[ ! -s probe.out ]]; then
  cp "$SERVICE" verify/thindisk-serve@t1.service
  cp "$SOCKET" verify/thindisk-serve@t1.socket
  MANPATH=$PREFIX/share/man systemd-analyze verify verify/thindisk-serve@t1.socket \
    verify/thindisk-serve@t1.service >verify.out 2>&1 || { cat verify.out >&2; fail "systemd-analyze verify failed"; }
  [[ ! -s verify.out ]] || { cat verify.out >&2; fail "systemd-analyze verify complains"; }
  echo "systemd-analyze verify: both units clean (Documentation= finds the installed page)"
else
  echo "(systemd-analyze verify cannot run here: $(head -c 200 probe.out 2>/dev/null); not checked)"
fi

# ---- 4. The service's command, socket-activated ---------------------------
# unit_argv INSTANCE CONF: ARGV becomes ExecStart as systemd would run it for
# thindisk-serve@INSTANCE with CONF as its EnvironmentFile, and ENV_ARGS the
# service's environment as systemd-socket-activate -E flags. Only what the
# unit uses is understood (%i, $VAR, ${VAR}); anything else fails.
unit_argv() {
  local inst=$1 conf=$2 line key value w name
  declare -gA ENV=()
  while IFS= read -r line; do
    line=${line//%i/$inst}
    [[ $line == *%* ]] && fail "$SERVICE: unsupported specifier in '$line'"
    ENV[${line%%=*}]=${line#*=}
  done < <(sed -n 's/^Environment=//p' "$SERVICE")
  [[ $(sed -n 's/^EnvironmentFile=//p' "$SERVICE") == "-/etc/thindisk/%i.conf" ]] ||
    fail "$SERVICE: want EnvironmentFile=-/etc/thindisk/%i.conf"
  if [[ -n $conf ]]; then
    while IFS= read -r line; do
      [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
      key=${line%%=*} value=${line#*=}
      [[ $value =~ ^\"(.*)\"$ ]] && value=${BASH_REMATCH[1]}
      ENV[$key]=$value
    done <"$conf"
  fi
  [[ $exec_start != *[\"\']* && $exec_start != [-@:+!]* ]] || fail "ExecStart too rich for this test: $exec_start"
  ARGV=()
  for w in $exec_start; do
    w=${w//%i/$inst}
    if [[ $w =~ ^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$ ]]; then
      ARGV+=("${ENV[${BASH_REMATCH[1]}]-}")
    elif [[ $w =~ ^\$([A-Za-z_][A-Za-z0-9_]*)$ ]]; then
      read -ra split <<<"${ENV[${BASH_REMATCH[1]}]-}"
      ARGV+=("${split[@]}")
    elif [[ $w == *[\$%]* ]]; then
      fail "ExecStart word this test cannot expand: $w"
    else
      ARGV+=("$w")
    fi
  done
  ENV_ARGS=()
  for name in "${!ENV[@]}"; do ENV_ARGS+=(-E "$name=${ENV[$name]}"); done
}

# Without a configuration file the image is /var/lib/thindisk/NAME.qcow2.
unit_argv disk1 ""
assert_eq "$BIN serve /var/lib/thindisk/disk1.qcow2" "${ARGV[*]}" "disk1's command without /etc/thindisk/disk1.conf"

# With one: its image and its options (two words, so SERVE_ARGS is split).
mkdir images run
SIZE=$((100 * 1024 * 1024 + 7 * 512))
"$BIN" create -q -f qcow2 images/disk1.qcow2 "$SIZE" || fail "$BIN create failed"
cat >disk1.conf <<EOF
# as /etc/thindisk/disk1.conf
IMAGE=$TMP/images/disk1.qcow2
SERVE_ARGS=-x disk1 --threads 2
EOF
unit_argv disk1 disk1.conf
assert_eq "$BIN serve -x disk1 --threads 2 $TMP/images/disk1.qcow2" "${ARGV[*]}" "disk1's command with disk1.conf"

log "systemd-socket-activate -l run/disk1.sock -- ${ARGV[*]}"
spawn activate systemd-socket-activate -l "$TMP/run/disk1.sock" "${ENV_ARGS[@]}" -- "${ARGV[@]}"
wait_for_socket "$TMP/run/disk1.sock"
URI="nbd+unix:///disk1?socket=$TMP/run/disk1.sock"
got_size=$(timeout 30 nbdinfo --size "$URI" 2>nbdinfo.err) ||
  { cat nbdinfo.err activate.err >&2; fail "nbdinfo --size $URI failed"; }
assert_eq "$SIZE" "$got_size" "nbdinfo --size through the activated socket"
timeout 30 nbdinfo --can write "$URI" || fail "the activated export is not writable"
# systemd-socket-activate execs the service in its own process.
assert_eq "$BIN" "$(readlink "/proc/$SERVER_PID/exe")" "the program serving the activated socket"
grep -q "on activated sockets" activate.out || { cat activate.out activate.err >&2; fail "thindisk did not serve the passed socket"; }
stop_server "$SERVER_PID" activate
"$BIN" check -q images/disk1.qcow2 || fail "$BIN check after serving found errors"
echo "socket activation: $BIN served $SIZE bytes as 'disk1', exited 0 on SIGTERM"
