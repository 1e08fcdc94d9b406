#!/usr/bin/env python3
"""Clients that never finish the NBD handshake, for tests/serve/silent_clients.sh.

  silent_client.py hold ADDRESS COUNT READY STOP LIMIT [half-option]
      Opens COUNT connections to ADDRESS and never sends a byte (nor reads);
      with half-option, each sends its client flags and then half of the
      largest option the server takes (64 KiB) and stalls there, the most a
      negotiating connection can make the server buffer. Prints "connected
      N of COUNT" and creates the file READY, then holds them until the
      file STOP exists or LIMIT seconds have passed, then prints how many
      the server had hung up on and closes them all.
  silent_client.py stall ADDRESS LIMIT
      Reads the server's greeting, sends the client flags (fixed newstyle,
      no zeroes) and nothing more; waits up to LIMIT seconds for the server
      to close the socket. Prints "closed after S s" and exits 0, or exits 1
      if the server kept the socket open (or sent something else).

ADDRESS is unix:PATH or tcp:HOST:PORT. Every wait is bounded; exit 2 on a
usage or connection error.
"""
import os
import select
import socket
import struct
import sys
import time

NBD_MAGIC = 0x4E42444D41474943  # "NBDMAGIC"
IHAVEOPT = 0x49484156454F5054  # "IHAVEOPT"
CLIENT_FLAGS = 1 | 2  # NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES
CONNECT_TIMEOUT = 10.0
MAX_OPTION_LENGTH = 64 * 1024  # kMaxOptionLength, src/nbd/protocol.h
NBD_OPT_GO = 7


def dial(address):
    kind, _, rest = address.partition(":")
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target = rest
    elif kind == "tcp":
        host, _, port = rest.rpartition(":")
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        target = (host, int(port))
    else:
        raise SystemExit(f"bad address {address!r}: want unix:PATH or tcp:HOST:PORT")
    s.settimeout(CONNECT_TIMEOUT)
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        try:
            s.connect(target)
            return s
        except BlockingIOError:
            # A Unix listener's backlog is full (a non-blocking connect does
            # not wait for room): try again while the server accepts.
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.001)


def closed_by_server(s):
    """True when the server hung up: readable, and a peek finds EOF or a reset."""
    readable, _, _ = select.select([s], [], [], 0)
    if not readable:
        return False
    try:
        # The greeting may be queued ahead of the EOF: skip it.
        while True:
            data = s.recv(4096)
            if not data:
                return True
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True


def half_option():
    header = struct.pack(">IQII", CLIENT_FLAGS, IHAVEOPT, NBD_OPT_GO, MAX_OPTION_LENGTH)
    return header + b"\0" * (MAX_OPTION_LENGTH // 2)


def hold(address, count, ready, stop, limit, mode):
    socks = []
    for i in range(count):
        try:
            s = dial(address)
            if mode == "half-option":
                s.sendall(half_option())
            socks.append(s)
        except OSError as e:
            print(f"connection {i + 1} failed: {e}", file=sys.stderr)
            break
    for s in socks:
        s.setblocking(False)  # closed_by_server peeks without waiting
    print(f"connected {len(socks)} of {count}", flush=True)
    with open(ready, "w"):
        pass
    deadline = time.monotonic() + limit
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = sum(1 for s in socks if closed_by_server(s))
    print(f"server hung up on {gone} of {len(socks)}", flush=True)
    for s in socks:
        s.close()
    return 0 if len(socks) == count else 1


def read_exact(s, n, deadline):
    buf = b""
    while len(buf) < n:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise SystemExit("the server closed before its greeting was complete")
        buf += chunk
    return buf


def stall(address, limit):
    s = dial(address)
    start = time.monotonic()
    greeting = read_exact(s, 18, start + limit)
    magic, opt, flags = struct.unpack(">QQH", greeting)
    if magic != NBD_MAGIC or opt != IHAVEOPT:
        print(f"not a newstyle greeting: {greeting.hex()}", file=sys.stderr)
        return 2
    s.sendall(struct.pack(">I", CLIENT_FLAGS))
    # Now say nothing: the server must hang up by itself.
    deadline = start + limit
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            print(f"still open after {limit} s", file=sys.stderr)
            return 1
        s.settimeout(left)
        try:
            data = s.recv(4096)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            print(f"closed after {time.monotonic() - start:.2f} s", flush=True)
            return 0
        print(f"unexpected {len(data)} bytes from the server", file=sys.stderr)
        return 1


def main(argv):
    if len(argv) in (6, 7) and argv[0] == "hold":
        mode = argv[6] if len(argv) == 7 else "silent"
        if mode not in ("silent", "half-option"):
            raise SystemExit(f"bad mode {mode!r}")
        return hold(argv[1], int(argv[2]), argv[3], argv[4], float(argv[5]), mode)
    if len(argv) == 3 and argv[0] == "stall":
        return stall(argv[1], float(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
