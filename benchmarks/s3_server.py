"""moto's S3 server behind a WSGI server that keeps connections alive, for benchmarks over slow links.

`moto_server` (werkzeug's development server) closes the connection after every request, so each store request
through a WAN link pays a TCP handshake and slow start from the initial window again: a round trip or more per
request that S3, MinIO or R2 (HTTP/1.1 keep-alive) do not charge. Here moto's application runs under waitress
(HTTP/1.1, persistent connections, 8 threads); every request is logged on stdout as `UNIX_TIME PEER "METHOD PATH
HTTP/1.1" STATUS` (when its answer starts), the access-log form `wan_bench.moto_requests` counts. It serves moto's S3
application alone, without `moto_server`'s dispatcher (which looks up the service of every request among all of
moto's) and out of Flask's debug mode: 2.3 ms of the server's CPU per request instead of 3.6 (a PUT, LIST, GET, GET
of a missing key and DELETE of 4.5 kB objects, 300 times, on this project's 2-core machine). In the WAN lab the
server shares the learner's cores, where a real deployment's store runs elsewhere. moto answers a DELETE with 204 No
Content, and waitress closes the connection after every 204 (it sends no Content-Length for one, and closes a
response without it): every DELETE cost its client a new connection, and over a lab link the next request on it a
TCP handshake and slow start, which S3 (204, connection kept alive) does not. Here a 204 goes out as a 200 with
`Content-Length: 0`, which clients take the same way (any 2xx), on a connection that stays open.

    python benchmarks/s3_server.py HOST PORT
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

NO_BODY = ("Content-Length", "0")


def logged(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """`app` with one access-log line per request on stdout."""

    def wrapper(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            query = environ.get("QUERY_STRING")
            path = environ.get("PATH_INFO", "") + (f"?{query}" if query else "")
            method, peer = environ["REQUEST_METHOD"], environ.get("REMOTE_ADDR")
            print(f'{time.time():.3f} {peer} "{method} {path} HTTP/1.1" {status[:3]}', flush=True)
            if status.startswith("204"):  # waitress closes the connection after any 204 (see above)
                status, headers = "200 OK", [*[h for h in headers if h[0].lower() != "content-length"], NO_BODY]
            return start_response(status, headers, *exc)

        return app(environ, start)

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    try:
        import waitress
        from moto.moto_server.werkzeug_app import create_backend_app
    except ImportError as err:
        sys.exit(f"error: {err.name} is missing: pip install -e '.[store-test]' (moto, waitress)")
    s3 = create_backend_app("s3")
    s3.debug = False  # moto turns it on: Flask's debug mode costs time on every request
    app = logged(s3)
    waitress.serve(app, host=args.host, port=args.port, threads=8, ident=None)


if __name__ == "__main__":
    main()
