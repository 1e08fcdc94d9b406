#!/usr/bin/env python3
"""An NBD fixed-newstyle client at the option level, for the TLS checks.

Usage: raw_client.py CHECK SOCKET CERTDIR [SECONDS]

SOCKET is the server's Unix socket; CERTDIR a client directory of
tests/tls/lib.sh's make_pki (ca-cert.pem, client-cert.pem, client-key.pem):
the client presents that certificate and verifies the server against
CERTDIR/ca-cert.pem for the name localhost. CHECK is one of

  plain-options      without TLS every option gets NBD_REP_ERR_TLS_REQD,
                     but NBD_OPT_ABORT (ack, or the connection closes) and
                     NBD_OPT_EXPORT_NAME (the connection closes, no export
                     data); NBD_OPT_STARTTLS with a payload gets
                     NBD_REP_ERR_INVALID
  starttls-twice     NBD_OPT_STARTTLS inside TLS gets NBD_REP_ERR_INVALID;
                     NBD_OPT_GO and a 512-byte read still work after it
  state-reset        (a server offering TLS optionally) options agreed in
                     plaintext do not survive STARTTLS: structured replies
                     asked for before it are not used after it
  injection          bytes sent with NBD_OPT_STARTTLS, before the TLS
                     handshake, are never taken for an option
  garbage-handshake  random bytes instead of a TLS handshake: the server
                     hangs up within a few seconds
  truncated-record   half a TLS record, then a hang-up, after NBD_OPT_GO:
                     the server still serves a new client
  stall-handshake    STARTTLS, then silence: the server hangs up within
                     SECONDS (its handshake timeout) + 5

Exit status: 0 the expected behaviour, 1 anything else (with a message on
stderr), 2 usage. Every read has a timeout. Python standard library only.
"""

import os
import socket
import ssl
import struct
import sys
import time

# The NBD protocol (NetworkBlockDevice/nbd doc/proto.md).
NBDMAGIC = 0x4E42444D41474943  # "NBDMAGIC"
IHAVEOPT = 0x49484156454F5054  # "IHAVEOPT", also the option request magic
OPT_REPLY_MAGIC = 0x0003E889045565A9
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
STRUCTURED_REPLY_MAGIC = 0x668E33EF

FLAG_FIXED_NEWSTYLE = 1 << 0
FLAG_NO_ZEROES = 1 << 1

OPT_EXPORT_NAME = 1
OPT_ABORT = 2
OPT_LIST = 3
OPT_PEEK_EXPORT = 4
OPT_STARTTLS = 5
OPT_INFO = 6
OPT_GO = 7
OPT_STRUCTURED_REPLY = 8
OPT_LIST_META_CONTEXT = 9
OPT_SET_META_CONTEXT = 10
OPT_UNKNOWN = 42

REP_ACK = 1
REP_INFO = 3
REP_META_CONTEXT = 4
REP_ERR = 1 << 31
REP_NAMES = {
    1: "NBD_REP_ACK", 2: "NBD_REP_SERVER", 3: "NBD_REP_INFO", 4: "NBD_REP_META_CONTEXT",
    REP_ERR + 1: "NBD_REP_ERR_UNSUP", REP_ERR + 2: "NBD_REP_ERR_POLICY",
    REP_ERR + 3: "NBD_REP_ERR_INVALID", REP_ERR + 4: "NBD_REP_ERR_PLATFORM",
    REP_ERR + 5: "NBD_REP_ERR_TLS_REQD", REP_ERR + 6: "NBD_REP_ERR_UNKNOWN",
    REP_ERR + 7: "NBD_REP_ERR_SHUTDOWN", REP_ERR + 8: "NBD_REP_ERR_BLOCK_SIZE_REQD",
    REP_ERR + 9: "NBD_REP_ERR_TOO_BIG",
}
REP_ERR_INVALID = REP_ERR + 3
REP_ERR_TLS_REQD = REP_ERR + 5

INFO_EXPORT = 0
CMD_READ = 0
CMD_DISC = 2

TIMEOUT = 10.0  # seconds, for every read that expects an answer


class Failure(Exception):
    """The server did not behave as the check expects."""


class Closed(Exception):
    """The server closed the connection (EOF or reset)."""


def rep_name(rtype):
    return REP_NAMES.get(rtype, "reply type 0x%x" % rtype)


# ---- Bytes on a socket (plain or TLS: both have sendall/recv) ------------

def recv_exact(sock, n, what):
    """n bytes, or Closed at EOF/reset; Failure on timeout."""
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except socket.timeout:
            raise Failure("timed out waiting for %s (%d of %d bytes)" % (what, len(buf), n))
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError) as e:
            raise Closed("%s: %s" % (what, e))
        if not chunk:
            raise Closed("%s: EOF after %d of %d bytes" % (what, len(buf), n))
        buf += chunk
    return buf


def read_until_closed(sock, limit):
    """Everything the peer sends until it closes, within limit seconds.
    Returns (bytes, closed)."""
    data = b""
    deadline = time.monotonic() + limit
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, False
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return data, False
        except (ConnectionResetError, BrokenPipeError):
            return data, True
        if not chunk:
            return data, True
        data += chunk


def connect(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT)
    try:
        sock.connect(path)
    except OSError as e:
        raise Failure("cannot connect to %s: %s" % (path, e))
    return sock


# ---- The handshake ---------------------------------------------------------

def greet(path):
    """Connects and does the fixed-newstyle greeting; returns the socket."""
    sock = connect(path)
    magic, opt_magic, flags = struct.unpack(">QQH", recv_exact(sock, 18, "the greeting"))
    if magic != NBDMAGIC or opt_magic != IHAVEOPT:
        raise Failure("not a newstyle NBD server (magic %#x %#x)" % (magic, opt_magic))
    if not flags & FLAG_FIXED_NEWSTYLE:
        raise Failure("server does not offer fixed newstyle (flags %#x)" % flags)
    sock.sendall(struct.pack(">I", FLAG_FIXED_NEWSTYLE | (flags & FLAG_NO_ZEROES)))
    return sock


def option(opt, data=b""):
    return struct.pack(">QII", IHAVEOPT, opt, len(data)) + data


def send_option(sock, opt, data=b""):
    sock.sendall(option(opt, data))


def read_reply(sock, opt):
    """One option reply to opt: (type, payload)."""
    magic, ropt, rtype, length = struct.unpack(">QIII", recv_exact(sock, 20, "the reply to option %d" % opt))
    if magic != OPT_REPLY_MAGIC:
        raise Failure("option %d: bad reply magic %#x" % (opt, magic))
    if ropt != opt:
        raise Failure("option %d: reply names option %d" % (opt, ropt))
    if length > 1 << 20:
        raise Failure("option %d: reply of %d bytes" % (opt, length))
    return rtype, recv_exact(sock, length, "the reply payload of option %d" % opt)


def expect_reply(sock, opt, want, why):
    rtype, _ = read_reply(sock, opt)
    if rtype != want:
        raise Failure("option %d (%s): got %s, want %s" % (opt, why, rep_name(rtype), rep_name(want)))


def go_payload(name=b"", infos=()):
    return struct.pack(">I", len(name)) + name + struct.pack(">H", len(infos)) + \
        b"".join(struct.pack(">H", i) for i in infos)


def meta_payload(queries, name=b""):
    return struct.pack(">I", len(name)) + name + struct.pack(">I", len(queries)) + \
        b"".join(struct.pack(">I", len(q)) + q for q in queries)


def tls_context(certdir):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the server and its name
    ctx.load_verify_locations(os.path.join(certdir, "ca-cert.pem"))
    ctx.load_cert_chain(os.path.join(certdir, "client-cert.pem"),
                        os.path.join(certdir, "client-key.pem"))
    return ctx


def starttls(sock, certdir):
    """NBD_OPT_STARTTLS, its ack, the TLS handshake; returns the TLS socket."""
    send_option(sock, OPT_STARTTLS)
    expect_reply(sock, OPT_STARTTLS, REP_ACK, "STARTTLS")
    try:
        return tls_context(certdir).wrap_socket(sock, server_hostname="localhost")
    except (ssl.SSLError, OSError) as e:
        raise Failure("TLS handshake failed: %s" % e)


def go(sock):
    """NBD_OPT_GO for the default export; returns its size."""
    send_option(sock, OPT_GO, go_payload())
    size = None
    while True:
        rtype, data = read_reply(sock, OPT_GO)
        if rtype == REP_ACK:
            break
        if rtype != REP_INFO:
            raise Failure("NBD_OPT_GO: got %s" % rep_name(rtype))
        if len(data) >= 12 and struct.unpack(">H", data[:2])[0] == INFO_EXPORT:
            size = struct.unpack(">Q", data[2:10])[0]
    if size is None:
        raise Failure("NBD_OPT_GO: no NBD_INFO_EXPORT before the ack")
    return size


def request(cmd, cookie, offset, length):
    return struct.pack(">IHHQQI", REQUEST_MAGIC, 0, cmd, cookie, offset, length)


def read_512(sock):
    """NBD_CMD_READ of 512 bytes at 0; returns the reply magic (the reply is
    checked and consumed)."""
    cookie = 0x7468696E64697363  # "thindisc"
    sock.sendall(request(CMD_READ, cookie, 0, 512))
    magic = struct.unpack(">I", recv_exact(sock, 4, "the read reply"))[0]
    if magic == SIMPLE_REPLY_MAGIC:
        error, rcookie = struct.unpack(">IQ", recv_exact(sock, 12, "the simple reply"))
        if rcookie != cookie or error != 0:
            raise Failure("read: error %d, cookie %#x" % (error, rcookie))
        recv_exact(sock, 512, "the data read")
    elif magic == STRUCTURED_REPLY_MAGIC:
        # One chunk is enough to tell: its header and payload are consumed.
        flags, rtype, rcookie, length = struct.unpack(">HHQI", recv_exact(sock, 16, "the chunk"))
        recv_exact(sock, min(length, 1 << 20), "the chunk payload")
    else:
        raise Failure("read: reply magic %#x" % magic)
    return magic


def disconnect(sock):
    try:
        sock.sendall(request(CMD_DISC, 0, 0, 0))
    except OSError:
        pass
    sock.close()


def served_session(path, certdir):
    """A whole good session: STARTTLS, GO, a read, a disconnect."""
    tls = starttls(greet(path), certdir)
    go(tls)
    if read_512(tls) != SIMPLE_REPLY_MAGIC:
        raise Failure("a structured reply without NBD_OPT_STRUCTURED_REPLY")
    disconnect(tls)


# ---- The checks ----------------------------------------------------------

def check_plain_options(path, certdir, args):
    # 1. Every option but STARTTLS, ABORT and EXPORT_NAME: TLS required.
    sock = greet(path)
    payloads = {
        OPT_LIST: b"", OPT_PEEK_EXPORT: b"", OPT_INFO: go_payload(), OPT_GO: go_payload(),
        OPT_STRUCTURED_REPLY: b"",
        OPT_LIST_META_CONTEXT: meta_payload([b"base:allocation"]),
        OPT_SET_META_CONTEXT: meta_payload([b"base:allocation"]),
        OPT_UNKNOWN: b"",
    }
    for opt, data in payloads.items():
        send_option(sock, opt, data)
        try:
            expect_reply(sock, opt, REP_ERR_TLS_REQD, "before TLS")
        except Closed as e:
            raise Failure("option %d before TLS: connection closed instead of NBD_REP_ERR_TLS_REQD (%s)" % (opt, e))
    # 2. ABORT: an ack (or a plain hang-up).
    send_option(sock, OPT_ABORT)
    try:
        rtype, _ = read_reply(sock, OPT_ABORT)
        if rtype not in (REP_ACK, REP_ERR_TLS_REQD):
            raise Failure("NBD_OPT_ABORT before TLS: got %s" % rep_name(rtype))
        note = rep_name(rtype)
    except Closed:
        note = "closed"
    data, closed = read_until_closed(sock, 5)
    if not closed or data:
        raise Failure("NBD_OPT_ABORT: the server neither hung up nor stayed silent (%d bytes)" % len(data))
    sock.close()
    # 3. STARTTLS with a payload (a connection of its own: a server may hang
    #    up after refusing it).
    sock = greet(path)
    send_option(sock, OPT_STARTTLS, b"\0\0\0\0")
    expect_reply(sock, OPT_STARTTLS, REP_ERR_INVALID, "STARTTLS with 4 bytes of payload")
    sock.close()
    # 4. EXPORT_NAME, last: it cannot be answered with an error, so the
    #    server must hang up, having sent nothing (export size or data).
    sock = greet(path)
    send_option(sock, OPT_EXPORT_NAME, b"")
    data, closed = read_until_closed(sock, TIMEOUT)
    if data:
        raise Failure("NBD_OPT_EXPORT_NAME before TLS: the server sent %d bytes (%s) instead of hanging up"
                      % (len(data), data[:32].hex()))
    if not closed:
        raise Failure("NBD_OPT_EXPORT_NAME before TLS: the connection stayed open")
    sock.close()
    print("plain-options: every option refused before TLS (NBD_OPT_ABORT: %s)" % note)


def check_starttls_twice(path, certdir, args):
    tls = starttls(greet(path), certdir)
    send_option(tls, OPT_STARTTLS)
    expect_reply(tls, OPT_STARTTLS, REP_ERR_INVALID, "a second STARTTLS, inside TLS")
    go(tls)
    read_512(tls)
    disconnect(tls)


def plaintext_structured_replies(sock):
    # Structured replies asked for and granted before any TLS.
    send_option(sock, OPT_STRUCTURED_REPLY)
    rtype, _ = read_reply(sock, OPT_STRUCTURED_REPLY)
    if rtype == REP_ERR_TLS_REQD:
        raise Failure("the server requires TLS: state-reset needs one that offers it optionally (--tls=on)")
    if rtype != REP_ACK:
        raise Failure("NBD_OPT_STRUCTURED_REPLY in plaintext: got %s" % rep_name(rtype))


def check_state_reset(path, certdir, args):
    # 1. The control: without STARTTLS, structured replies asked for are
    #    used (so step 2 can tell whether they survived).
    sock = greet(path)
    plaintext_structured_replies(sock)
    go(sock)
    if read_512(sock) != STRUCTURED_REPLY_MAGIC:
        raise Failure("control: structured replies agreed (in plaintext), yet a simple reply")
    disconnect(sock)
    # 2. Structured replies and a meta context agreed in plaintext, then
    #    STARTTLS: after it the session starts afresh.
    sock = greet(path)
    plaintext_structured_replies(sock)
    send_option(sock, OPT_SET_META_CONTEXT, meta_payload([b"base:allocation"]))
    while True:
        rtype, _ = read_reply(sock, OPT_SET_META_CONTEXT)
        if rtype == REP_ACK:
            break
        if rtype != REP_META_CONTEXT:
            raise Failure("NBD_OPT_SET_META_CONTEXT in plaintext: got %s" % rep_name(rtype))
    tls = starttls(sock, certdir)
    go(tls)
    magic = read_512(tls)
    if magic != SIMPLE_REPLY_MAGIC:
        raise Failure("after STARTTLS the server still sends structured replies, agreed in plaintext "
                      "(pre-TLS state survived, as nbdkit's CVE-2021-3716)")
    disconnect(tls)


def check_injection(path, certdir, args):
    sock = greet(path)
    # STARTTLS and a plaintext GO in one send(): the GO is not the client's
    # TLS ClientHello, so the server must take it as (bad) TLS, never as NBD.
    sock.sendall(option(OPT_STARTTLS) + option(OPT_GO, go_payload()))
    expect_reply(sock, OPT_STARTTLS, REP_ACK, "STARTTLS")
    data, closed = read_until_closed(sock, TIMEOUT)
    if struct.pack(">Q", OPT_REPLY_MAGIC) in data:
        raise Failure("the server answered the injected plaintext NBD_OPT_GO")
    if data and data[0] != 0x15:  # anything but a TLS alert record
        raise Failure("after the injected bytes the server sent %d bytes (%s), not a TLS alert"
                      % (len(data), data[:16].hex()))
    if not closed:
        raise Failure("the server kept the connection with injected bytes for %ds" % TIMEOUT)
    sock.close()


def check_garbage_handshake(path, certdir, args):
    sock = greet(path)
    send_option(sock, OPT_STARTTLS)
    expect_reply(sock, OPT_STARTTLS, REP_ACK, "STARTTLS")
    # The first byte is no TLS record type, so no server can wait for more.
    sock.sendall(b"\0" + os.urandom(199))
    start = time.monotonic()
    data, closed = read_until_closed(sock, TIMEOUT)
    if not closed:
        raise Failure("200 bytes of garbage as a TLS handshake: still connected after %ds" % TIMEOUT)
    if data and data[0] != 0x15:
        raise Failure("the server answered garbage with %d bytes (%s), not a TLS alert"
                      % (len(data), data[:16].hex()))
    print("garbage-handshake: closed after %.1fs" % (time.monotonic() - start))
    sock.close()


def check_truncated_record(path, certdir, args):
    tls = starttls(greet(path), certdir)
    go(tls)
    # Half a record on the socket under TLS: an application-data header
    # announcing 100 bytes, then 10 of them, then the hang-up.
    raw = socket.socket(fileno=os.dup(tls.fileno()))
    raw.sendall(b"\x17\x03\x03\x00\x64" + os.urandom(10))
    raw.close()
    tls.close()
    time.sleep(0.2)
    try:
        served_session(path, certdir)
    except (Failure, Closed) as e:
        raise Failure("after a truncated TLS record the server does not serve a new client: %s" % e)


def check_stall_handshake(path, certdir, args):
    if len(args) != 1:
        raise Failure("stall-handshake needs SECONDS (the server's handshake timeout)")
    limit = float(args[0]) + 5
    sock = greet(path)
    send_option(sock, OPT_STARTTLS)
    expect_reply(sock, OPT_STARTTLS, REP_ACK, "STARTTLS")
    start = time.monotonic()
    data, closed = read_until_closed(sock, limit)
    if not closed:
        raise Failure("a client silent after STARTTLS is still connected after %.0fs" % limit)
    print("stall-handshake: closed after %.1fs" % (time.monotonic() - start))
    sock.close()


CHECKS = {
    "plain-options": check_plain_options,
    "starttls-twice": check_starttls_twice,
    "state-reset": check_state_reset,
    "injection": check_injection,
    "garbage-handshake": check_garbage_handshake,
    "truncated-record": check_truncated_record,
    "stall-handshake": check_stall_handshake,
}


def main(argv):
    if len(argv) < 4 or argv[1] not in CHECKS:
        sys.stderr.write("usage: raw_client.py {%s} SOCKET CERTDIR [SECONDS]\n" % "|".join(CHECKS))
        return 2
    check, path, certdir = argv[1:4]
    try:
        CHECKS[check](path, certdir, argv[4:])
    except Failure as e:
        sys.stderr.write("raw_client %s: FAIL: %s\n" % (check, e))
        return 1
    except Closed as e:
        sys.stderr.write("raw_client %s: FAIL: the server closed the connection: %s\n" % (check, e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
