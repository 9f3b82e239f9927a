"""moto's S3 server behind a WSGI server that keeps connections alive, for benchmarks over slow links.

`moto_server` (werkzeug's development server) closes the connection after every request, so each store request
through a WAN link pays a TCP handshake and slow start from the initial window again: a round trip or more per
request that S3, MinIO or R2 (HTTP/1.1 keep-alive) do not charge. Here moto's application runs under waitress
(HTTP/1.1, persistent connections, 8 threads); every request is logged on stdout as `UNIX_TIME PEER "METHOD PATH
HTTP/1.1" STATUS` (when its answer starts), the access-log form `wan_bench.moto_requests` counts.

    python benchmarks/s3_server.py HOST PORT
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any


def logged(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """`app` with one access-log line per request on stdout."""

    def wrapper(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            query = environ.get("QUERY_STRING")
            path = environ.get("PATH_INFO", "") + (f"?{query}" if query else "")
            method, peer = environ["REQUEST_METHOD"], environ.get("REMOTE_ADDR")
            print(f'{time.time():.3f} {peer} "{method} {path} HTTP/1.1" {status[:3]}', flush=True)
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
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    except ImportError as err:
        sys.exit(f"error: {err.name} is missing: pip install -e '.[store-test]' (moto, waitress)")
    app = logged(DomainDispatcherApplication(create_backend_app))
    waitress.serve(app, host=args.host, port=args.port, threads=8, ident=None)


if __name__ == "__main__":
    main()
