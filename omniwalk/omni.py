"""``Omni``: the in-process API over the walk runtime (continuous batching across requests).

    omni = Omni(model="CKPT_DIR", device="cpu", dtype="float32")
    out = omni.generate({"messages": [...], "max_tokens": 64, "temperature": 0.0})
    out.prompt_token_ids, out.token_ids, out.text, out.finish_reason, out.logprobs
    out.audio                       # with "modalities": ["text", "audio"] (and the family's extras)
    for event in omni.stream(request): ...    # Event("text", str) / Event("audio", float32 chunk)
    omni.abort(request_id)
    omni.load_adapter("NAME", "PEFT_DIR"); omni.generate(request, lora="NAME"); omni.unload_adapter("NAME")

The checkpoint's model family (``models/registry.py``, by config.json ``architectures``) loads it,
builds the engine's stages and turns requests into walks and outputs; ``omni.family`` is it.
``generate`` takes one request dict (-> ``RequestOutput``) or a list (-> list, run concurrently);
the request keys are those of ``models/family.py`` and an optional ``request_id``. Invalid
requests raise ``InvalidRequestError`` before anything runs; a request that fails while running
ends with ``finish_reason == "error"`` and its ``error``, and no other request is affected.

LoRA adapters of the thinker (PEFT directories; ``omniwalk/lora/``) are served beside the base model
when ``max_loras`` > 0 (or ``loras`` names some to load at start): a request runs with one by its
``"lora"`` key (or ``generate``'s ``lora``), any mix of adapters and the base in one batch.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

from omniwalk.config import OmniConfig
from omniwalk.engine.engine import Engine, EngineLimits
from omniwalk.engine.request import EngineRequest, Event, Status
from omniwalk.errors import ConfigError, InvalidRequestError
from omniwalk.models.family import RequestOutput
from omniwalk.models.locate import locate
from omniwalk.models.registry import family_module
from omniwalk.parallel import ranks
from omniwalk.parallel.group import start_ranks


class Omni:
    def __init__(self, model: str, **options):
        """``options`` are ``ModelConfig``, ``EngineConfig``, ``MediaLimits`` and the model family's
        ``Options`` fields (device, dtype, max_model_len, ...)."""
        model = str(locate(str(model), options.get("random_weights", False), options.get("hf_cache")))
        family = family_module(model)
        self.config = OmniConfig.from_kwargs(getattr(family, "Options", None), model=model, **options)
        # tensor parallelism: rank 0 (this process, unless it is a worker) starts the other ranks
        split = self.config.model.tensor_parallel > 1
        self.leader = start_ranks({**options, "model": model}) if split and not ranks.is_split() else None
        try:
            start = time.perf_counter()
            self.family = family.Family(self.config)
            # (a follower rank never refuses a request rank 0 admitted)
            is_follower = ranks.rank_of(self.config.model.tensor_parallel) > 0
            limit = 2**31 if is_follower else self.config.engine.max_requests
            self.engine = Engine(self.family.build_stages(), EngineLimits(limit))
            # start-up phases, seconds: the model (weights, KV pools), then each stage's CUDA graphs
            # (their first warm-up compiles the stage's Triton kernels: most of a cold start)
            self.startup = {"model": time.perf_counter() - start}
            self.startup |= {f"graphs {name}": s for name, s in self.engine.capture_graphs().items()}
            if self.leader is not None:
                self.leader.joined(self.engine.stages)
        except BaseException:
            self.close()  # (the other ranks, if this one started them)
            raise
        self._ids = itertools.count()

    def generate(self, requests: dict | list[dict], lora: str | None = None) -> RequestOutput | list[RequestOutput]:
        """Run the request(s) to the end; ``lora``: the adapter each runs with (a request's own ``"lora"``
        key says it per request)."""
        single = isinstance(requests, dict)
        named = lambda r: {**r, "lora": lora} if lora is not None and isinstance(r, dict) else r  # noqa: E731
        reqs = [self.add(named(r)) for r in ([requests] if single else requests)]
        while any(not r.status.is_done for r in reqs):
            self.step()
        outputs = [self.output(r) for r in reqs]
        return outputs[0] if single else outputs

    def stream(self, request: dict) -> Iterator[Event]:
        """Run one request (beside any others in flight) and yield its text and audio events."""
        req = self.add({**request, "stream": True} if isinstance(request, dict) else request)
        while True:
            while req.events:
                event = req.events.popleft()
                if event.kind in ("finished", "error"):
                    if event.kind == "error":
                        raise event.data
                    return
                yield event
            self.step()

    def step(self) -> bool:
        """One engine step (on every tensor-parallel rank); whether any stage launched work."""
        return self.engine.step() if self.leader is None else self.leader.run_step(self.engine)

    def abort(self, request_id: str) -> bool:
        if self.leader is not None:
            self.leader.aborted(request_id)
        return self.engine.abort(request_id)

    @property
    def adapters(self) -> list[str]:
        """The LoRA adapters requests may name."""
        adapters = self._adapters(required=False)
        return adapters.names() if adapters is not None else []

    def load_adapter(self, name: str, path: str) -> None:
        """Serve the PEFT adapter at ``path`` as ``name`` (``AdapterError`` naming what it refuses)."""
        self._adapters().load(name, path)

    def unload_adapter(self, name: str) -> None:
        """Stop serving ``name`` to new requests; those using it finish with it."""
        self._adapters().unload(name)

    def _adapters(self, required: bool = True):
        adapters = self.family.adapters
        if adapters is None and required:
            raise ConfigError("this engine has no adapter slots: start it with max_loras > 0")
        return adapters

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (nothing to do with one)."""
        if self.leader is not None:
            self.leader.close()
            self.leader = None

    def add(self, request: dict) -> EngineRequest:
        """Validate and process a request and hand it to the engine (raises on bad input)."""
        if not isinstance(request, dict):
            raise InvalidRequestError("a request is a dict with 'messages'")
        modalities = request.get("modalities") or ["text"]
        if not isinstance(modalities, list) or sorted(modalities) not in (["text"], ["audio", "text"]):
            raise InvalidRequestError(f"modalities must be ['text'] or ['text', 'audio'], got {modalities!r}")
        if "audio" in modalities and "audio" not in self.family.info.output_modalities:
            raise InvalidRequestError("this model has no audio output")
        rid = str(request.get("request_id") or f"req-{next(self._ids)}")
        if self.leader is not None:
            request = self.leader.admit(request, rid)
        walk, state = self.family.new_request(request)
        req = EngineRequest(rid, walk, state)
        self.engine.add(req)
        if self.leader is not None:
            self.leader.added(request)
        return req

    def output(self, req: EngineRequest) -> RequestOutput:
        out = self.family.output(req)
        out.finish_reason = {Status.ABORTED: "abort", Status.FAILED: "error"}.get(req.status, out.finish_reason)
        out.error = None if req.error is None else f"{type(req.error).__name__}: {req.error}"
        return out
