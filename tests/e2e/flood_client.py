#!/usr/bin/env python3
"""Connection floods for the e2e hostile-client tests.

    flood_client.py MODE HOST PORT [--count N] [--sources K] [--hold S] [--ready FILE] ...

MODE is what each connection does once connected:
  idle            nothing (on a TLS port: the handshake never starts)
  drip            sends a request head one byte every --drip seconds and never ends it
                  (with --tls: after a completed TLS handshake)
  partial-hello   sends the first half of a real TLS ClientHello, then nothing
  wrong-password  GET /metrics with basic-auth credentials that are wrong, for the user --user
                  and for unknown users in turn; the next one as soon as the answer came

--count slots each hold one connection, bound to the source addresses 127.0.0.2 ..
127.0.0.(K+1) in turn (Linux routes all of 127/8 to lo), so that a per-address connection
limit of the server meets K addresses. When the server closes a slot's connection, the slot
connects again --reopen seconds later. --ready FILE is created once every slot has connected
(or failed to) once; the flood then goes on for --hold seconds and the client prints one JSON
object with its counts. Every wait is bounded: the whole run ends within --hold + 30 s.
"""
import argparse
import base64
import errno
import heapq
import json
import random
import resource
import selectors
import socket
import ssl
import sys
import time

CONNECT_TIMEOUT = 5.0
ANSWER_TIMEOUT = 30.0
READY_BUDGET = 20.0  # the flood starts by then even if some first connects hang

args_parser = argparse.ArgumentParser()
args_parser.add_argument("mode", choices=["idle", "drip", "partial-hello", "wrong-password"])
args_parser.add_argument("host")
args_parser.add_argument("port", type=int)
args_parser.add_argument("--count", type=int, default=100)
args_parser.add_argument("--sources", type=int, default=1)
args_parser.add_argument("--hold", type=float, default=10.0)
args_parser.add_argument("--drip", type=float, default=2.0)
args_parser.add_argument("--reopen", type=float, default=0.2)
args_parser.add_argument("--early", type=float, default=1.0,
                         help="a connection the server closes sooner than this after it was "
                              "made counts as refused at once")
args_parser.add_argument("--tls", action="store_true")
args_parser.add_argument("--user", default="prometheus")
args_parser.add_argument("--ready")
args = args_parser.parse_args()
if not 1 <= args.sources <= 250:
    sys.exit("--sources: 1 to 250 addresses")


def raise_fd_limit(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:  # root may raise the hard limit too
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
            return
        except (ValueError, OSError):
            needed = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


raise_fd_limit(args.count + 64)

tls_context = ssl.create_default_context()
tls_context.check_hostname = False
tls_context.verify_mode = ssl.CERT_NONE


def client_hello():
    """The bytes a real client opens its handshake with."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = tls_context.wrap_bio(incoming, outgoing, server_hostname=args.host)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


HELLO = client_hello()
# The record header announces the whole ClientHello; half of it leaves the server waiting.
HELLO_PART = HELLO[: len(HELLO) // 2]
DRIP_HEAD = f"GET /metrics HTTP/1.1\r\nHost: {args.host}\r\nX-Drip: ".encode()
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


def basic(user, password):
    return base64.b64encode(f"{user}:{password}".encode()).decode()


class Conn:
    __slots__ = ("slot", "sock", "state", "started", "connected", "closed", "how",
                 "next_send", "sent", "deadline", "answer", "sent_request")

    def __init__(self, slot, sock, now):
        self.slot = slot
        self.sock = sock
        self.state = "connecting"
        # When connect() was called: the server cannot accept before. Whether the server
        # refused a connection at once or held it is judged by its age from here, so that a
        # client late to notice its connects (a loaded machine, a thousand TLS handshakes in
        # one Python loop) never makes a held connection look refused. (How long one was
        # seen open, max_open_seconds, counts from when its connect was seen to complete.)
        self.started = now
        self.connected = None
        self.closed = None
        self.how = None  # "eof" / "reset": by the server; "client"; "end": still open at the end
        self.next_send = None
        self.sent = 0
        self.deadline = now + CONNECT_TIMEOUT
        self.answer = b""
        self.sent_request = None


sel = selectors.DefaultSelector()
conns = []          # every connection made, for the report
live = set()
reopen_at = []      # heap of (time, slot)
first_done = set()  # slots whose first connection has been made or has failed
connect_errors = {}
statuses = {}
answer_seconds = []
no_answer = 0
answered_data = 0
attempt = 0
start = time.monotonic()
ready_at = None
end_at = start + READY_BUDGET + args.hold


def source(slot):
    return f"127.0.0.{2 + slot % args.sources}"


def open_conn(slot, now):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
    except OSError:
        pass
    c = Conn(slot, s, now)
    conns.append(c)
    try:
        s.bind((source(slot), 0))
        s.connect((args.host, args.port))
    except BlockingIOError:
        pass
    except OSError as e:
        fail_connect(c, e.errno, now)
        return
    live.add(c)
    sel.register(s, selectors.EVENT_WRITE, c)


def fail_connect(c, err, now):
    name = errno.errorcode.get(err, str(err))
    connect_errors[name] = connect_errors.get(name, 0) + 1
    c.state = "failed"
    finish(c, now, None)


def finish(c, now, how):
    """Ends a connection; `how` None for one that never connected."""
    if c in live:
        live.discard(c)
        try:
            sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
    c.closed = now
    if how:
        c.how = how
    try:
        c.sock.close()
    except OSError:
        pass
    first_done.add(c.slot)
    if ready_at is None or now < end_at:
        heapq.heappush(reopen_at, (now + args.reopen, c.slot))


def send(c, data, now):
    try:
        n = c.sock.send(data)
        c.sent += n
        return True
    except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
        return True
    except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
        finish(c, now, "reset")
        return False


def on_connected(c, now):
    c.connected = now
    c.state = "open"
    first_done.add(c.slot)
    sel.modify(c.sock, selectors.EVENT_READ, c)
    if args.mode == "drip":
        if args.tls:
            # wrap_socket takes the descriptor over from the plain socket object.
            sel.unregister(c.sock)
            c.sock = tls_context.wrap_socket(c.sock, server_hostname=args.host,
                                             do_handshake_on_connect=False)
            sel.register(c.sock, selectors.EVENT_READ, c)
            c.state = "handshake"
            c.deadline = now + CONNECT_TIMEOUT
            step_handshake(c, now)
            return
        start_drip(c, now)
    elif args.mode == "partial-hello":
        send(c, HELLO_PART, now)
    elif args.mode == "wrong-password":
        send_wrong_password(c, now)


def start_drip(c, now):
    c.state = "open"
    c.deadline = None
    drip(c, now)


def drip(c, now):
    byte = DRIP_HEAD[c.sent:c.sent + 1] or b"a"
    if send(c, byte, now):
        # Spread over the interval so that the bytes do not all arrive at one instant.
        c.next_send = now + args.drip * random.uniform(0.9, 1.1)


def step_handshake(c, now):
    try:
        c.sock.do_handshake()
    except ssl.SSLWantReadError:
        sel.modify(c.sock, selectors.EVENT_READ, c)
        return
    except ssl.SSLWantWriteError:
        sel.modify(c.sock, selectors.EVENT_WRITE, c)
        return
    except (ssl.SSLError, OSError):
        finish(c, now, "reset")
        return
    sel.modify(c.sock, selectors.EVENT_READ, c)
    start_drip(c, now)


def send_wrong_password(c, now):
    global attempt
    attempt += 1
    if attempt % 2:
        creds = basic(args.user, f"wrong-{attempt}")
    else:
        creds = basic(f"intruder-{attempt}", f"guess-{attempt}")
    request = (f"GET /metrics HTTP/1.1\r\nHost: {args.host}\r\nAuthorization: Basic {creds}\r\n"
               "Connection: close\r\n\r\n").encode()
    c.deadline = now + ANSWER_TIMEOUT
    c.sent_request = now
    send(c, request, now)


def on_readable(c, now):
    global answered_data, no_answer
    if c.state == "handshake":
        step_handshake(c, now)
        return
    try:
        data = c.sock.recv(65536)
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
        return
    except (ConnectionResetError, ssl.SSLError, OSError):
        if args.mode == "wrong-password":
            no_answer += 1
        finish(c, now, "reset")
        return
    if not data:
        if args.mode == "wrong-password":
            no_answer += 1
        finish(c, now, "eof")
        return
    if args.mode != "wrong-password":
        if not c.answer:
            answered_data += 1
        c.answer = b"x"
        return
    c.answer += data
    if b"\r\n" in c.answer:
        line = c.answer.split(b"\r\n", 1)[0].split()
        status = line[1].decode(errors="replace") if len(line) > 1 else "?"
        statuses[status] = statuses.get(status, 0) + 1
        answer_seconds.append(now - c.sent_request)
        finish(c, now, "client")


def on_writable(c, now):
    if c.state == "handshake":
        step_handshake(c, now)
        return
    err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        fail_connect(c, err, now)
    else:
        on_connected(c, now)


def on_timers(now):
    global no_answer
    for c in list(live):
        if c.state == "connecting" and now >= c.deadline:
            fail_connect(c, errno.ETIMEDOUT, now)
        elif c.state == "handshake" and now >= c.deadline:
            connect_errors["handshake-timeout"] = connect_errors.get("handshake-timeout", 0) + 1
            finish(c, now, "client")
        elif c.state == "open":
            if args.mode == "drip" and c.next_send is not None and now >= c.next_send:
                drip(c, now)
            elif args.mode == "wrong-password" and now >= c.deadline:
                no_answer += 1
                finish(c, now, "client")


for slot in range(args.count):
    open_conn(slot, time.monotonic())

last_timers = 0.0
# The longest the loop took to come round: how late this client may notice anything (a
# close, a connect), for the tests' time budgets.
max_loop_gap = 0.0
loop_at = time.monotonic()
while True:
    now = time.monotonic()
    max_loop_gap = max(max_loop_gap, now - loop_at)
    loop_at = now
    if ready_at is None and (len(first_done) >= args.count or now - start >= READY_BUDGET):
        ready_at = now
        end_at = now + args.hold
        if args.ready:
            with open(args.ready, "w") as f:
                f.write("ready\n")
    if now >= end_at:
        break
    for key, events in sel.select(timeout=0.05):
        c = key.data
        if c not in live:
            continue
        now = time.monotonic()
        if c.state == "connecting":
            on_writable(c, now)
        elif events & selectors.EVENT_READ:
            on_readable(c, now)
        elif events & selectors.EVENT_WRITE:
            on_writable(c, now)
    now = time.monotonic()
    while reopen_at and reopen_at[0][0] <= now and now < end_at:
        _, slot = heapq.heappop(reopen_at)
        open_conn(slot, now)
    if now - last_timers >= 0.05:
        last_timers = now
        on_timers(now)

end = time.monotonic()
for c in list(live):
    if c.state in ("open", "handshake"):
        c.how = "end"
    c.closed = end
    live.discard(c)
    try:
        c.sock.close()
    except OSError:
        pass

made = [c for c in conns if c.connected is not None]
by_server = [c for c in made if c.how in ("eof", "reset")]
# Closed early: the server refused it at once (closed sooner than --early after connect() was
# called; a connection the server held until a timeout is older than that, however late this
# client noticed the close).
early = [c for c in by_server if c.closed - c.started < args.early]
# Held: outlived --early, so not refused at once; the server closed it or it was open at the end.
held = [c for c in made
        if c.how in ("eof", "reset", "end") and c.closed - c.started >= args.early]
held_then_closed = [c for c in held if c.how != "end"]
# A connection is known to be held by the server once it has outlived --early; count how many
# were so at once.
events = sorted([(c.started + args.early, 1) for c in held] + [(c.closed, -1) for c in held])
peak = cur = 0
for _, d in events:
    cur += d
    peak = max(peak, cur)
answer_seconds.sort()
report = {
    "mode": args.mode,
    "slots": args.count,
    "sources": args.sources,
    "ready_seconds": round(ready_at - start, 3),
    "attack_seconds": round(end - ready_at, 3),
    "connects": len(conns),
    "connected": len(made),
    "connect_failed": len(conns) - len(made),
    "connect_errors": connect_errors,
    "closed_by_server": len(by_server),
    "closed_early": len(early),
    "held_then_closed": len(held_then_closed),
    "still_open": sum(1 for c in made if c.how == "end"),
    "peak_held": peak,
    "max_open_seconds": round(max((c.closed - c.connected for c in made
                                   if c.how in ("eof", "reset", "end")), default=0.0), 3),
    "min_held_seconds": round(min((c.closed - c.connected for c in held_then_closed),
                                  default=0.0), 3),
    "max_loop_gap_seconds": round(max_loop_gap, 3),
    "answered_data": answered_data,
    "bytes_sent": sum(c.sent for c in conns),
    # Connections that sent a byte after their first (dripped at least once) and that the
    # server then closed: what a timeout restarted by each byte would never close.
    "dripped_then_closed": sum(1 for c in by_server if c.sent >= 2),
    "statuses": statuses,
    "no_answer": no_answer,
    "answer_seconds_median": round(answer_seconds[len(answer_seconds) // 2], 3)
    if answer_seconds else None,
    "answer_seconds_max": round(answer_seconds[-1], 3) if answer_seconds else None,
}
print(json.dumps(report, sort_keys=True))
sys.stdout.flush()
