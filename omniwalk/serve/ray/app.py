"""omniwalk as a Ray Serve application: ingress replicas in front of engine replicas.

    HTTP / WebSocket -> Ray's proxy -> "ingress" replicas: the HTTP app of ``omniwalk serve`` (every
                        route, the realtime WebSocket, media decoding, VAD) with ``RayEngines`` as its
                        engine client
                     -> "engine" replicas: ``EngineReplica``, one engine process each, reached through a
                        streaming DeploymentHandle routed by ``AffinityRouter``

    serve run omniwalk.serve.ray.app:build_app model=CKPT data_parallel=2      # Ray's own CLI
    serve deploy deploy/serve-config.yaml                                    # (args: the same keys)
    omniwalk serve --ray auto --model CKPT --data-parallel 2                 # launch.py

``build_app``'s arguments are ``omniwalk serve``'s flags without the dashes (``data_parallel``,
``ray_max_replicas``, ...), parsed by the same parser. Engine replicas: ``data_parallel`` of them, or
autoscaled on unfinished requests between ``ray_min_replicas`` and ``ray_max_replicas``; each asks Ray
for ``ray_engine_num_cpus`` CPUs and, on CUDA, ``tensor_parallel`` GPUs (Ray sets its
CUDA_VISIBLE_DEVICES, so its placement starts at GPU 0). A replica's health check fails once its
engine process is gone, and Ray replaces it; scale-down and redeploys drain a replica for up to
``shutdown_grace_s`` (its requests in flight finish).
"""

from __future__ import annotations

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Application

from omniwalk.config import RayConfig, ServerConfig
from omniwalk.media.limits import MediaLimits
from omniwalk.serve.app import create_app
from omniwalk.serve.ray.client import RayEngines
from omniwalk.serve.ray.engine import EngineReplica
from omniwalk.serve.ray.router import AffinityRouter
from omniwalk.serve.supervisor import Supervisor

HEALTH_CHECK_TIMEOUT_S = 10.0
METRICS_INTERVAL_S = 10.0  # how often replicas report their load to the autoscaler, at most (Ray's default)


@serve.ingress()
class Ingress:
    """The HTTP app of ``omniwalk serve`` in a Ray Serve replica, its engine client the engine deployment."""

    def __init__(self, engine, server: ServerConfig, limits: MediaLimits, cfg: RayConfig):
        self.engines = RayEngines(engine, cfg)
        self.supervisor = Supervisor(self.engines, server.shutdown_grace_s, "(Ray Serve)", server.served_model_name)
        self.http_app = create_app(self.engines, server, limits, self.supervisor)

    def __serve_build_asgi_app__(self):
        return self.http_app


def engine_deployment(options: dict, server: ServerConfig, cfg: RayConfig):
    """The engine deployment's options from the configs (see the module head)."""
    gpus = options.get("tensor_parallel", 1) if str(options.get("device", "cpu")).startswith("cuda") else 0
    scaling = {"num_replicas": server.data_parallel}
    if cfg.autoscales:
        autoscaling = {"min_replicas": cfg.ray_min_replicas, "max_replicas": cfg.ray_max_replicas}
        autoscaling |= {"target_ongoing_requests": cfg.ray_target_ongoing_requests}
        autoscaling |= {"upscale_delay_s": cfg.ray_upscale_delay_s, "downscale_delay_s": cfg.ray_downscale_delay_s}
        window = cfg.ray_autoscaling_window_s
        autoscaling |= {"look_back_period_s": window, "metrics_interval_s": min(METRICS_INTERVAL_S, window / 2)}
        scaling = {"autoscaling_config": autoscaling}
    routing = server.routing
    router = RequestRouterConfig(
        request_router_class=AffinityRouter,
        request_router_kwargs={
            "affinity": routing.affinity,
            "saturation": routing.saturation,
            "max_excess": routing.max_excess,
        },
    )
    return serve.deployment(
        EngineReplica,
        name="engine",
        ray_actor_options={"num_cpus": cfg.ray_engine_num_cpus, "num_gpus": gpus},
        max_ongoing_requests=cfg.ray_max_ongoing_requests,
        health_check_period_s=cfg.ray_health_check_period_s,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
        graceful_shutdown_timeout_s=server.shutdown_grace_s,
        request_router_config=router,
        **scaling,
    )


def application(server: ServerConfig, limits: MediaLimits, options: dict, cfg: RayConfig) -> Application:
    """The bound application: ``cfg.ray_ingress_replicas`` ingress replicas over the engine deployment."""
    engine = engine_deployment(options, server, cfg).bind(options)
    ingress = serve.deployment(
        Ingress,
        name="ingress",
        num_replicas=cfg.ray_ingress_replicas,
        ray_actor_options={"num_cpus": cfg.ray_ingress_num_cpus},
        max_ongoing_requests=server.max_connections,
        graceful_shutdown_timeout_s=server.shutdown_grace_s,
    )
    return ingress.bind(engine, server, limits, cfg)


def build_app(args: dict[str, str]) -> Application:
    """The application from ``serve run`` / ``serve deploy`` arguments (``omniwalk serve``'s flags
    without the dashes, e.g. ``model=CKPT data_parallel=2``)."""
    import dataclasses

    from omniwalk.cli import build_parser, checkpoint_or_embedded, serve_configs

    argv = ["serve"]
    for name, value in args.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    parsed = build_parser().parse_args(argv)
    server, limits, options, model = serve_configs(parsed)
    options["model"] = str(checkpoint_or_embedded(model))
    cfg = RayConfig(**{f.name: getattr(parsed, f.name) for f in dataclasses.fields(RayConfig)})
    return application(server, limits, options, cfg)
