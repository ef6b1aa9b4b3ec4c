"""``kvgraft serve --ray``: the same server as N replicas on Ray Serve, behind Ray Serve's HTTP proxy.

Each replica is a Ray actor that opens its own `GraftEngine` on the same library (a URL, or a folder
every node can read) and serves it with `create_app`, the app ``kvgraft serve`` runs: same routes, same
bodies, same errors. Ray Serve's proxy spreads requests over the replicas. The engine knows nothing of
Ray; this module is the whole integration.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["ray_application", "serve_on_ray"]

logger = logging.getLogger(__name__)


class _Replica:
    """One engine and its app. Ray builds it in the replica's process (``__serve_build_asgi_app__``)."""

    def __init__(self, library: str | None, settings: Mapping[str, Any], api_key: str | None, max_queue: int) -> None:
        from kvgraft_plugin.engine.engine import GraftEngine

        from .app import create_app

        self.engine = GraftEngine(library, **settings)
        self._kvgraft_app = create_app(self.engine, api_key=api_key, max_queue=max_queue)

    def __serve_build_asgi_app__(self) -> Any:
        return self._kvgraft_app


def ray_application(
    library: str | None,
    settings: Mapping[str, Any],
    *,
    replicas: int,
    api_key: str | None = None,
    max_queue: int = 64,
) -> Any:
    """A Ray Serve application of ``replicas`` engines on ``library`` (``settings``: `GraftEngine` keywords).

    Each replica reserves ``n_threads`` CPUs, so Ray places no more replicas on a node than its cores run.
    """
    from ray import serve

    deployment: Any = serve.deployment(
        serve.ingress()(_Replica),
        name="kvgraft",
        num_replicas=replicas,
        ray_actor_options={"num_cpus": settings.get("n_threads") or 1},
    )
    return deployment.bind(library, dict(settings), api_key, max_queue)


def serve_on_ray(
    library: str | None,
    settings: Mapping[str, Any],
    *,
    host: str,
    port: int,
    replicas: int,
    api_key: str | None,
    max_queue: int,
) -> None:
    """Start (or join, with ``RAY_ADDRESS``) a Ray instance, run the application, and serve until
    SIGTERM/SIGINT; then Serve shuts down and the process exits 0."""
    import ray
    from ray import serve

    ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    serve.start(http_options={"host": host, "port": port})
    serve.run(ray_application(library, settings, replicas=replicas, api_key=api_key, max_queue=max_queue))
    logger.info("serving %d replicas on http://%s:%d", replicas, host, port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    serve.shutdown()
    ray.shutdown()
