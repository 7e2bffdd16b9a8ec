#!/usr/bin/env python3
"""Hostile TLS clients for the e2e tests: each connection ends with a TCP reset (SO_LINGER 0)
at the stage `mode` names, or with a close before reading the response.

    hostile_client.py MODE HOST PORT COUNT
"""
import socket
import ssl
import struct
import sys

mode, host, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
REQUEST = f"GET /metrics HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: gzip\r\n\r\n".encode()


def reset(sock):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


for _ in range(count):
    raw = socket.create_connection((host, port), timeout=5)
    if mode == "reset-in-handshake":
        # The first bytes of a ClientHello, then a reset.
        raw.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        reset(raw)
        continue
    tls = ctx.wrap_socket(raw, server_hostname=host)
    if mode == "reset-after-handshake":
        pass
    elif mode == "reset-mid-request":
        tls.sendall(REQUEST[:20])
    elif mode in ("reset-after-request", "close-after-request"):
        tls.sendall(REQUEST)
        if mode == "close-after-request":
            tls.close()
            continue
    else:
        sys.exit(f"unknown mode {mode}")
    # Reset the TCP connection under the TLS session, without a close_notify.
    reset(tls)
