"""What every service's Prometheus metrics share: the ``/metrics`` endpoint, the latency buckets, and
the families of the multiplexed stream that both postprocessors and workers serve.

Each service's own families live in the service (docs/metrics.md lists them all):
services/gateway/frontend_metrics.py (names follow ``--metrics-prefix``), services/preprocessor/metrics.py,
services/router/metrics.py, services/postprocessor/metrics.py, services/workers/metrics.py. Names follow
Dynamo's where they overlap (dynamo-frontend.md §9), with a ``meshfront_<service>_`` prefix. Updates
happen once per request or per message, never per token, so the hot path pays nothing for them.

Each set is created once per process (``mux_metrics()`` ...) so that the all-in-one gateway, which
hosts the router and postprocessor in-process, and tests that build several service objects register
every name exactly once.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import Counter, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)

# Latency buckets in seconds: TTFT from a few ms (cache hit, mocker) to minutes (long prefill queue).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


def serve_metrics(port: int, host: str = "0.0.0.0") -> bool:  # noqa: S104 - scraped from other pods
    """Starts the ``/metrics`` HTTP endpoint in a daemon thread; returns whether it started."""
    if port <= 0:
        return False
    server_class = type("MetricsServer", (ThreadingWSGIServer,), {
        "address_family": socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]})
    httpd: ThreadingWSGIServer = make_server(host, port, make_wsgi_app(), server_class, handler_class=_QuietHandler)
    # prometheus_client's start_http_server polls every 0.5 s for a shutdown that never comes (the thread
    # dies with the process): two wake-ups a second, GIL and all, in every idle process (bench/idle.py).
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 3600.0}, daemon=True,
                     name="metrics-http").start()
    log.info("metrics on http://%s:%d/metrics", host, port)
    return True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not worth a line each on stderr."""


@dataclasses.dataclass(frozen=True)
class MuxMetrics:
    messages: Counter
    chunks: Counter


@functools.cache
def mux_metrics() -> MuxMetrics:
    """What the serving side of each ``GenerateStream`` sent: chunks / messages is how many requests'
    output one message carried (services/common/mux_session.py); counted per message, not per chunk."""
    p = "meshfront_mux_"
    return MuxMetrics(
        messages=Counter(f"{p}messages", "GenerateStream response messages sent", ["rpc"]),
        chunks=Counter(f"{p}chunks", "Sequence chunks those messages carried", ["rpc"]),
    )
