"""omniwalk on a Ray cluster (Ray Serve; the ``[ray]`` extra). Nothing outside this package imports it,
so omniwalk works without Ray installed.

    app.py      the application: ingress deployment (the HTTP app) -> engine deployment; ``build_app``
    engine.py   the engine replica: one engine process (reached over ZMQ by the ingresses), its health check
    client.py   the ingress's engine client: ``Replicas``' interface over the engine handle, retries
    router.py   Ray Serve's request router for the engine deployment, on ``serve/routing.py``'s policy
    launch.py   ``omniwalk serve --ray ADDRESS``
"""
