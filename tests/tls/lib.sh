# shellcheck shell=bash
# Helpers for the TLS scripts of `thindisk serve`. Source it first:
#   source "$(dirname "$0")/lib.sh"
# It sources tests/serve/lib.sh (fail, log, skip_or_fail, require_tool,
# spawn, the temp dir) and adds a throwaway PKI (make_pki) and a TLS server
# of any of three kinds (start_tls_server).
#
# Environment:
#   TLS_SERVER      which server the scripts judge: thindisk (the default),
#                   or a reference server, qemu-nbd or nbdkit, against
#                   which the scripts themselves were checked.
#   THINDISK        the thindisk binary (only needed for TLS_SERVER=thindisk)
#   CI or THINDISK_REQUIRE_TOOLS   a missing tool (or a thindisk that cannot
#                   serve TLS) fails instead of skipping
TLS_SERVER=${TLS_SERVER:-thindisk}
case $TLS_SERVER in
  thindisk | qemu-nbd | nbdkit) ;;
  *) echo "TLS_SERVER must be thindisk, qemu-nbd or nbdkit, not '$TLS_SERVER'" >&2; exit 1 ;;
esac
# tests/serve/lib.sh requires a built thindisk; a reference server does not
# need one, so `false` stands in for it (any use of $TD then fails loudly).
if [[ $TLS_SERVER != thindisk ]] && ! command -v "${THINDISK:-thindisk}" >/dev/null 2>&1; then
  THINDISK=false
fi
TLS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../serve/lib.sh
source "$TLS_DIR/../serve/lib.sh"
RAW_CLIENT=$TLS_DIR/raw_client.py

require_tool certtool python3

# ---- A throwaway PKI ------------------------------------------------------

# pki_key FILE: a fresh ECDSA P-256 key (fast; every TLS stack here takes it).
pki_key() { certtool --generate-privkey --key-type=ecdsa --outfile "$1" 2>/dev/null; }

# pki_ca DIR CN: a self-signed CA, DIR/ca-key.pem and DIR/ca-cert.pem.
pki_ca() {
  mkdir -p "$1"
  pki_key "$1/ca-key.pem"
  printf '%s\n' "cn = \"$2\"" 'ca' 'cert_signing_key' 'expiration_days = 30' >"$1/ca.info"
  certtool --generate-self-signed --load-privkey "$1/ca-key.pem" --template "$1/ca.info" \
    --outfile "$1/ca-cert.pem" >/dev/null 2>&1 || fail "certtool: CA $2"
}

# pki_cert CA_DIR KEY CERT TEMPLATE_LINES...: a certificate for KEY (made
# here) signed by the CA in CA_DIR, from the template lines given.
pki_cert() {
  local ca=$1 key=$2 cert=$3
  shift 3
  pki_key "$key"
  printf '%s\n' "$@" >"$cert.info"
  certtool --generate-certificate --load-privkey "$key" --load-ca-certificate "$ca/ca-cert.pem" \
    --load-ca-privkey "$ca/ca-key.pem" --template "$cert.info" --outfile "$cert" >/dev/null 2>&1 ||
    fail "certtool: certificate $cert"
  rm -f "$cert.info"
}

# pki_client CA_DIR DIR CN: DIR/client-cert.pem, client-key.pem for
# CN=CN,O=thindisk test, and DIR/ca-cert.pem the real CA (so the client
# trusts the server whichever CA signed its own certificate).
pki_client() {
  mkdir -p "$2"
  pki_cert "$1" "$2/client-key.pem" "$2/client-cert.pem" "cn = \"$3\"" 'organization = "thindisk test"' \
    'expiration_days = 30' 'tls_www_client' 'signing_key' 'encryption_key'
  cp "$PKI_CA/ca-cert.pem" "$2/ca-cert.pem"
}

# pki_server DIR [TEMPLATE_LINES...]: DIR/server-cert.pem, server-key.pem
# for localhost (dns_name and ip_address 127.0.0.1) signed by the real CA,
# and DIR/ca-cert.pem (the CA the server verifies clients against).
pki_server() {
  local dir=$1
  shift
  mkdir -p "$dir"
  pki_cert "$PKI_CA" "$dir/server-key.pem" "$dir/server-cert.pem" 'cn = "localhost"' \
    'dns_name = "localhost"' 'ip_address = "127.0.0.1"' 'tls_www_server' 'signing_key' \
    'encryption_key' "$@"
  cp "$PKI_CA/ca-cert.pem" "$dir/ca-cert.pem"
}

# psk_key: 32 random bytes in hex, a PSK as psktool writes it.
psk_key() { od -An -tx1 -N32 /dev/urandom | tr -d ' \n'; }

# make_pki DIR: credentials laid out as servers and clients read them:
#   DIR/server    ca-cert.pem, server-cert.pem (CN=localhost), server-key.pem
#   DIR/expired   the same, but server-cert.pem expired yesterday
#   DIR/alice     ca-cert.pem, client-cert.pem (CN=alice,O=thindisk test),
#                 client-key.pem: libnbd's tls-certificates= and qemu's
#                 tls-creds-x509,endpoint=client,dir= layout
#   DIR/bob       the same for CN=bob (valid, for authorization refusals)
#   DIR/mallory   CN=mallory, signed by an unrelated CA (ca-cert.pem is the
#                 real CA: mallory trusts the server, not the reverse)
#   DIR/psk/keys.psk          alice:HEX (servers, libnbd, qemu's dir=)
#   DIR/psk-wrong/keys.psk    alice with another key
#   DIR/psk-unknown/keys.psk  carol:HEX
# Sets PKI (DIR, absolute), the DNs ALICE_DN and BOB_DN as the
# certificates print them (RFC 4514, CN first: "CN=alice,O=thindisk test")
# and ALICE_DN_LEGACY, alice's DN in the certificate's encoding order
# ("O=thindisk test,CN=alice"), as qemu 7.2 matches authorization lists.
make_pki() {
  mkdir -p "$1"
  PKI=$(realpath "$1")
  PKI_CA=$PKI/ca
  pki_ca "$PKI_CA" "thindisk test CA"
  pki_ca "$PKI/evil-ca" "unrelated CA"
  pki_server "$PKI/server"
  # activation two days ago, expiry yesterday
  pki_server "$PKI/expired" \
    "activation_date = \"$(date -u -d '2 days ago' '+%Y-%m-%d %H:%M:%S')\"" \
    "expiration_date = \"$(date -u -d '1 day ago' '+%Y-%m-%d %H:%M:%S')\""
  pki_client "$PKI_CA" "$PKI/alice" alice
  pki_client "$PKI_CA" "$PKI/bob" bob
  pki_client "$PKI/evil-ca" "$PKI/mallory" mallory
  mkdir -p "$PKI/psk" "$PKI/psk-wrong" "$PKI/psk-unknown"
  echo "alice:$(psk_key)" >"$PKI/psk/keys.psk"
  echo "alice:$(psk_key)" >"$PKI/psk-wrong/keys.psk"
  echo "carol:$(psk_key)" >"$PKI/psk-unknown/keys.psk"
  chmod 600 "$PKI"/psk*/keys.psk "$PKI"/*/*-key.pem
  pki_check
}

# pki_check: the PKI is what the scripts assume (certtool's own view).
pki_check() {
  local out
  out=$(certtool --verify --load-ca-certificate "$PKI_CA/ca-cert.pem" \
    --infile "$PKI/server/server-cert.pem" 2>&1) || fail "server certificate does not verify: $out"
  out=$(certtool --verify --load-ca-certificate "$PKI_CA/ca-cert.pem" \
    --infile "$PKI/expired/server-cert.pem" 2>&1) && fail "expired certificate verifies: $out"
  grep -qi expired <<<"$out" || fail "certtool does not call the expired certificate expired: $out"
  certtool --verify --load-ca-certificate "$PKI_CA/ca-cert.pem" \
    --infile "$PKI/mallory/client-cert.pem" >/dev/null 2>&1 && fail "mallory verifies against the real CA"
  ALICE_DN=$(pki_subject "$PKI/alice/client-cert.pem")
  [[ $ALICE_DN == "CN=alice,O=thindisk test" ]] || fail "alice's DN is '$ALICE_DN'"
  # shellcheck disable=SC2034 # read by the scripts
  BOB_DN=$(pki_subject "$PKI/bob/client-cert.pem") ALICE_DN_LEGACY="O=thindisk test,CN=alice"
}

# pki_subject CERT: the subject DN as certtool prints it.
pki_subject() { certtool -i --infile "$1" | sed -n 's/^[[:space:]]*Subject: //p'; }

# ---- TLS servers -----------------------------------------------------------

# tls_uri SOCKET CLIENT_DIR: the libnbd URI of the export on SOCKET with
# X.509 credentials CLIENT_DIR (a make_pki client directory).
tls_uri() { echo "nbds+unix:///?socket=$1&tls-certificates=$2"; }

# psk_uri SOCKET USER KEYS_FILE: the same with a PSK.
psk_uri() { echo "nbds+unix://$2@/?socket=$1&tls-psk-file=$3"; }

# qemu_x509 CLIENT_DIR / qemu_psk KEYS_DIR USER: the --object of a qemu
# client (id tls0). qemu_nbd_opts SOCKET: its --image-opts for the export
# (over a Unix socket qemu wants a tls-hostname to check the server against).
qemu_x509() { echo "tls-creds-x509,id=tls0,dir=$1,endpoint=client"; }
qemu_psk() { echo "tls-creds-psk,id=tls0,dir=$1,endpoint=client,username=$2"; }
qemu_nbd_opts() { echo "driver=nbd,server.type=unix,server.path=$1,tls-creds=tls0,tls-hostname=localhost"; }
# qemu_nbd_tcp_opts PORT: the same for an export on 127.0.0.1:PORT.
qemu_nbd_tcp_opts() { echo "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$1,tls-creds=tls0,tls-hostname=localhost"; }

# start_tls_server KIND SOCKET IMAGE CREDS [ARGS...]: a TLS server of KIND
# (thindisk, qemu-nbd or nbdkit) serving IMAGE (qcow2 when it ends in
# .qcow2, else raw; nbdkit serves raw only) on the Unix socket SOCKET, or
# on 127.0.0.1:PORT when SOCKET is tcp:PORT, in the background (output in
# SOCKET-without-.sock.out/.err, tcp-PORT.out/.err); when SOCKET is
# sa:PORT, systemd-socket-activate listens on 127.0.0.1:PORT and hands the
# socket to the server (LISTEN_FDS; output in sa-PORT.out/.err). CREDS is a
# make_pki server directory (X.509, client certificates required and
# verified) or a keys.psk file (PSK). TLS_MODE=on (default require) offers
# TLS without requiring it. ARGS are passed to the server as they are (they
# are KIND's own options). Waits for the socket (10 s) and sets SERVER_PID;
# the server is killed at exit.
start_tls_server() {
  try_start_tls_server "$@" || {
    cat "$(basename "${2/:/-}" .sock).err" >&2 2>/dev/null || true
    fail "$1 did not start serving $3 on $2 (see above)"
  }
}

# try_start_tls_server KIND SOCKET IMAGE CREDS [ARGS...]: start_tls_server,
# but returns 1 when the server exits (or has no socket after 10 s) instead
# of failing; the server's stderr is then in SOCKET-without-.sock.err.
try_start_tls_server() {
  local kind=$1 sock=$2 image=$3 creds=$4 fmt=raw cmd listen name port= activate=
  shift 4
  local mode=${TLS_MODE:-require}
  [[ $image == *.qcow2 ]] && fmt=qcow2
  if [[ $sock == tcp:* ]]; then
    port=${sock#tcp:} name=tcp-$port
  elif [[ $sock == sa:* ]]; then
    port=${sock#sa:} name=sa-$port activate=1
  else
    name=$(basename "$sock" .sock)
  fi
  case $kind in
    thindisk)
      listen=(-k "$sock")
      [[ -z $port ]] || listen=(-b 127.0.0.1 -p "$port")
      [[ -z $activate ]] || listen=()
      cmd=("$TD" serve "${listen[@]}" -f "$fmt" "--tls=$mode")
      if [[ -d $creds ]]; then cmd+=(--tls-creds "$creds"); else cmd+=(--tls-psk "$creds"); fi
      cmd+=("$@" "$image")
      ;;
    qemu-nbd)
      # qemu-nbd has no "TLS optional" mode: --tls-creds always requires it.
      [[ $mode == require ]] || fail "qemu-nbd cannot offer TLS optionally (TLS_MODE=$mode)"
      if [[ -d $creds ]]; then
        cmd=(qemu-nbd --object "tls-creds-x509,id=tls0,dir=$creds,endpoint=server,verify-peer=on")
      else
        cmd=(qemu-nbd --object "tls-creds-psk,id=tls0,dir=$(dirname "$creds"),endpoint=server")
      fi
      listen=(-k "$sock")
      [[ -z $port ]] || listen=(-b 127.0.0.1 -p "$port")
      [[ -z $activate ]] || listen=()
      cmd+=(--tls-creds tls0 "${listen[@]}" -f "$fmt" -t "$@" "$image")
      ;;
    nbdkit)
      [[ $fmt == raw ]] || fail "nbdkit's file plugin serves raw images only: $image"
      cmd=(nbdkit -f "--tls=$mode")
      if [[ -d $creds ]]; then
        cmd+=("--tls-certificates=$creds" --tls-verify-peer)
      else
        cmd+=("--tls-psk=$creds")
      fi
      listen=(-U "$sock")
      [[ -z $port ]] || listen=(-i 127.0.0.1 -p "$port")
      [[ -z $activate ]] || listen=()
      cmd+=("${listen[@]}" "$@" file "$image")
      ;;
    *) fail "start_tls_server: unknown server kind '$kind'" ;;
  esac
  [[ -z $activate ]] || cmd=(systemd-socket-activate -l "127.0.0.1:$port" "${cmd[@]}")
  spawn "$name" "${cmd[@]}"
  local i
  for ((i = 0; i < 200; i++)); do
    if [[ -n $port ]]; then tcp_listening "$port" && return 0; else [[ -S $sock ]] && return 0; fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.05
  done
  kill -KILL "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  forget_server "$SERVER_PID"
  return 1
}

# free_port: a TCP port free on 127.0.0.1 just now.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# tcp_listening PORT: something listens on 127.0.0.1:PORT (or any address).
# Read from /proc, not by connecting, so the server sees no client.
tcp_listening() {
  local hex
  hex=$(printf '%04X' "$1")
  awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6
}

# require_tls_server: the server TLS_SERVER names can be started at all
# (its binary exists and accepts --tls-creds); else the script skips (77),
# or fails under CI/THINDISK_REQUIRE_TOOLS.
require_tls_server() {
  case $TLS_SERVER in
    thindisk)
      [[ $TD != false ]] || skip_or_fail "thindisk not built"
      [[ $("$TD" serve --help 2>&1) == *--tls-psk* ]] ||
        skip_or_fail "$TD serve has no TLS yet (no --tls-psk in its --help)"
      ;;
    *) require_tool "$TLS_SERVER" ;;
  esac
}

# image_for_server NAME SIZE|RAW_FILE: creates an image for TLS_SERVER
# (qcow2, raw for nbdkit), empty of SIZE or holding RAW_FILE's bytes, and
# prints its name.
image_for_server() {
  local ext=qcow2
  [[ $TLS_SERVER == nbdkit ]] && ext=raw
  if [[ -f $2 ]]; then
    qemu-img convert -q -f raw -O "$ext" "$2" "$1.$ext"
  else
    qemu-img create -q -f "$ext" "$1.$ext" "$2"
  fi
  echo "$1.$ext"
}

# raw_check CHECK SOCKET CERTDIR [ARGS...]: tests/tls/raw_client.py CHECK;
# its failure fails the script with its message.
raw_check() {
  local out
  out=$(timeout 60 python3 "$RAW_CLIENT" "$@" 2>&1) || fail "raw_client.py $1: $out"
  [[ -z $out ]] || echo "$out"
}

# stop_tls PID NAME: SIGTERM, and the server must exit 0 within 30 s.
stop_tls() { stop_server "$1" "$2"; }

# with_default_certs CERTDIR SOCKET CMD...: runs CMD (a libnbd client
# that cannot take tls-certificates= in its URI, e.g. fio's nbd engine) in
# DEFAULT_CERTS_HOME with HOME there, where libnbd looks for certificates
# by default ($HOME/.pki/libnbd), holding CERTDIR's. libnbd's default for
# root is /etc/pki/libnbd, not ours to write: as root CMD runs as nobody
# (65534), which may then reach SOCKET and this temp dir.
with_default_certs() {
  local certs=$1 sock=$2
  shift 2
  DEFAULT_CERTS_HOME=$TMP/default-certs-home
  mkdir -p "$DEFAULT_CERTS_HOME/.pki/libnbd"
  cp "$certs"/*.pem "$DEFAULT_CERTS_HOME/.pki/libnbd/"
  if ((EUID == 0)); then
    chown -R 65534:65534 "$DEFAULT_CERTS_HOME"
    chmod o+x "$TMP"
    chmod o+rw "$sock"
    (cd "$DEFAULT_CERTS_HOME" &&
      setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$DEFAULT_CERTS_HOME" "$@")
  else
    (cd "$DEFAULT_CERTS_HOME" && HOME=$DEFAULT_CERTS_HOME "$@")
  fi
}
