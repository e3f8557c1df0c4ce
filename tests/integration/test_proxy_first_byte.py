"""A proxied read's first bytes go to the client as soon as the origin sent them: the reader used
to be woken only once 128 KiB waited in the ring (or the stream was complete), and since
libmicrohttpd sends the answer's headers with the first body block, the client's time to first
byte included that much of the origin's transfer (issue 25: TTFB within 1 ms of direct)."""
import socket
import threading

from test_proxy_retry import origin_srv  # noqa: F401 (the fixture)
from test_verify import blobs_of
from util_http import TIMEOUT, sha, wait_until

KiB = 1024
FIRST = 10 * KiB


def test_first_bytes_reach_the_client_while_the_origin_holds_the_rest(origin_srv):  # noqa: F811
    data = blobs_of(31, [600 * KiB])[0]
    h = sha(data)
    srv, origin = origin_srv([data])
    release = threading.Event()
    # headers first, the body's first bytes 0.3 s later (time for the handler to answer and find
    # the ring empty; were it slower, the bytes would be there at once and the test pass anyway)
    origin.stall = [FIRST, release, 0.3]
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=TIMEOUT) as s:
            s.sendall(f"GET /v1/blobs/{h} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                      .encode())
            raw = b""
            s.settimeout(0.2)

            def have_first():
                nonlocal raw
                try:
                    raw += s.recv(65536)
                except socket.timeout:
                    pass
                head, sep, body = raw.partition(b"\r\n\r\n")
                return bool(sep) and len(body) >= FIRST

            # the origin holds everything after FIRST bytes: they must arrive meanwhile
            assert wait_until(have_first, timeout=10), raw[:200]
            assert raw.startswith(b"HTTP/1.1 200")
            release.set()
            s.settimeout(TIMEOUT)
            while True:
                piece = s.recv(65536)
                if not piece:
                    break
                raw += piece
        assert raw.partition(b"\r\n\r\n")[2] == data
    finally:
        release.set()
