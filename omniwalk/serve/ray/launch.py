"""``omniwalk serve --ray ADDRESS``: deploy the Ray Serve application on a cluster and wait.

The command connects to the cluster (``--ray auto``: the one ``ray start`` made this node part of;
``--ray local``: a one-node cluster started here; else its address), starts Serve's HTTP proxy on
``--host``/``--port``, deploys ``app.application`` as ``--ray-app-name`` and waits for SIGINT or
SIGTERM, which delete the application (its replicas drain for ``shutdown_grace_s``). The exit status
is 0 after a stop, 1 when the application failed to deploy.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import threading

from omniwalk.config import RayConfig, ServerConfig
from omniwalk.errors import ConfigError
from omniwalk.media.limits import MediaLimits


def serve_on_ray(args: argparse.Namespace, server: ServerConfig, limits: MediaLimits, options: dict, model) -> int:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ConfigError("--ray needs Ray Serve: pip install 'omniwalk[ray]'") from None

    from omniwalk.cli import checkpoint_or_embedded
    from omniwalk.serve.ray.app import application

    cfg = RayConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RayConfig)})
    options = {**options, "model": str(checkpoint_or_embedded(model))}
    ray.init(address=None if cfg.ray == "local" else cfg.ray, logging_level=server.log_level.upper())
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": server.host, "port": server.port})
        serve.run(application(server, limits, options, cfg), name=cfg.ray_app_name, route_prefix="/")
    except Exception as e:  # noqa: BLE001 - the deployment's own error, printed for the user
        print(f"omniwalk: error: the Ray Serve application failed to deploy: {e}", flush=True)
        ray.shutdown()
        return 1
    print(f"ready: http://{server.host}:{server.port}/v1 (Ray Serve application {cfg.ray_app_name!r})", flush=True)
    stop.wait()
    serve.delete(cfg.ray_app_name)
    ray.shutdown()
    print("stopped", flush=True)
    return 0
