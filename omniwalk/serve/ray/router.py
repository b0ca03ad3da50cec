"""Ray Serve's request router for the engine deployment, applying omniwalk's one routing policy.

Ray Serve runs a request router inside every ``DeploymentHandle`` (here: in each ingress replica).
``AffinityRouter.choose_replicas`` hands ``routing.Router`` the engine replicas it sees, each with
the requests this router sent it that have not completed, and the request's affinity ``key`` (a
keyword argument of ``EngineReplica.generate``, computed by the ingress): least outstanding by
default, the key's replica when it is not saturated. Replicas named in ``avoid`` (ones that reported
their engine gone; Ray's replacement of a replica has a new id) count as unhealthy. The chosen
replica is ranked first and the others after it, least loaded first, so a replica at its
``max_ongoing_requests`` passes the request on instead of queueing it.

The ingress hears of the router's first choice for a request at once: ``client.CHOICES`` holds, by
request id (``generate``'s first argument), a callable that it calls with the chosen replica's id, from
the router's own thread (Ray runs it on a loop of its own unless its throughput-optimized mode is on).
It is read as the client module's attribute: Ray pickles this module by value, its globals with it.

A request counts as outstanding on a replica from its routing there to its completion, matched by
(request, replica): Ray reports a completion before the routing when a call ends before its acceptance is
read (a busy event loop, a replica that ends the call at once), and reports the completions of attempts
the replica rejected, which were never routed; neither may leave a count behind.
"""

from __future__ import annotations

from collections import OrderedDict

from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

from omniwalk.config import RoutingConfig
from omniwalk.serve.ray import client as ingress
from omniwalk.serve.routing import NoReplica, ReplicaLoad, Router

MAX_UNMATCHED = 4096  # completions kept waiting for their routing (a rejected attempt's never comes)


class AffinityRouter(RequestRouter):
    def initialize_state(self, **routing) -> None:
        """``routing``: ``RoutingConfig``'s fields (the deployment's ``request_router_kwargs``; its defaults else)."""
        self.policy = Router(RoutingConfig(**routing))
        self.outstanding: dict[str, int] = {}  # replica id -> requests routed to it, not completed
        self.running: set[tuple[str, str]] = set()  # (internal request id, replica id) routed, not completed
        # completions not matched by a routing (yet): its routing comes later, or it was a rejected attempt
        self.unmatched: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        kwargs = pending_request.kwargs if pending_request is not None else {}
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # (every replica is a candidate at once)
        avoid = set(kwargs.get("avoid") or ())
        by_name = {r.replica_id.unique_id: r for r in candidate_replicas}
        loads = [ReplicaLoad(name, self.outstanding.get(name, 0), name not in avoid) for name in by_name]
        try:
            chosen = self.policy.choose(loads, kwargs.get("key"))
        except NoReplica:
            return []
        if pending_request is not None and pending_request.args and isinstance(pending_request.args[0], str):
            if (told := ingress.CHOICES.pop(pending_request.args[0], None)) is not None:
                told(chosen)
        rest = sorted((load for load in loads if load.healthy and load.name != chosen), key=lambda r: r.outstanding)
        return [[by_name[chosen]], [by_name[load.name] for load in rest]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult) -> None:
        key = (pending_request.metadata.internal_request_id, replica_id.unique_id)
        if key in self.unmatched:  # (it has completed already)
            del self.unmatched[key]
            return
        self.running.add(key)
        self.outstanding[key[1]] = self.outstanding.get(key[1], 0) + 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        key = (internal_request_id, replica_id.unique_id)
        if key in self.running:
            self.running.remove(key)
            self.outstanding[key[1]] -= 1
            return
        self.unmatched[key] = None
        while len(self.unmatched) > MAX_UNMATCHED:
            self.unmatched.popitem(last=False)  # (the oldest: rejected attempts, never routed)
