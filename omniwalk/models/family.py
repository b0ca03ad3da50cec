"""The socket a model family plugs into: ``Omni``, the engine process, the OpenAI layer and the CLI
reach a model only through this interface and the registry (``models/registry.py``), so a second
family is one package under ``models/`` and nothing above it changes.

    load         Family(config): normalise the checkpoint's config, read its tokenizer and weights
    stages       build_stages() -> the engine's stages over the family's programs
    requests     new_request(request) -> (walk, state), or InvalidRequestError naming the problem
    outputs      the programs emit "text" / "audio" events; output(req) -> RequestOutput at the end
    serving      info: ModelInfo (served name, output modalities, voices, extra request fields, media resizing)
    checkpoints  make_tiny(...) and describe(path) for ``omniwalk make-tiny`` / ``inspect``

A request is a dict: ``messages`` (OpenAI chat), ``modalities`` (["text"] or ["text", "audio"],
checked against ``info.output_modalities`` before the family sees it), the ``SamplingParams``
fields, ``voice``, ``forced_answer`` (a text to speak as the answer: ``/v1/audio/speech``),
``stream`` (True when the caller takes the output events as they come: ``Omni.stream``, a streamed
chat; a family may then decode for latency where the whole output would decode differently, e.g. a
vocoder run window by window) and the family's own ``info.request_fields``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omniwalk.media.patch_spec import PatchSpec

if TYPE_CHECKING:
    import torch

    from omniwalk.config import OmniConfig
    from omniwalk.engine.engine import Stage
    from omniwalk.engine.request import EngineRequest
    from omniwalk.models.common.programs.adapters import ThinkerAdapters
    from omniwalk.sampling import TokenLogprob


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated ids, including a final EOS / stop token when one ended the request
    text: str  # special tokens skipped; cut before the first stop string
    finish_reason: str  # "stop" (EOS, stop token or stop string), "length", "abort" or "error"
    logprobs: list[TokenLogprob] | None = None
    audio: torch.Tensor | None = None  # float32 mono at ``ModelInfo.sample_rate``, when "audio" was requested
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens the thinker took from prefix pages instead of computing them
    num_audio_prompt_tokens: int = 0  # the prompt's audio placeholder tokens (the rest is text and images)


@dataclass(frozen=True)
class ModelInfo:
    """What the server tells clients and checks requests against (sent by the engine process)."""

    name: str  # the served model name, unless the server is given one
    output_modalities: tuple[str, ...] = ("text",)  # ("text",) or ("text", "audio")
    voices: tuple[str, ...] = ()  # lower case, for audio out
    sample_rate: int = 0  # Hz of audio out
    # request fields beyond the OpenAI ones: name -> kind (``serve/schemas.py`` FIELD_KINDS)
    request_fields: dict[str, str] = field(default_factory=dict)
    speech_fields: tuple[str, ...] = ()  # those of them ``/v1/audio/speech`` takes too
    # the loaded weights, as /v1/models and the start-up log show them (e.g. quantization, GiB per component)
    weights: dict[str, Any] = field(default_factory=dict)
    # "image" / "video" -> the sizes the family's processor resizes them to: the server's media pool
    # resizes so, and the engine's own measuring then resizes nothing (a kind not named here is
    # decoded at its size and resized in the engine)
    patch_specs: dict[str, PatchSpec] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, fields: dict) -> ModelInfo:
        """``dataclasses.asdict(info)`` after the wire, which makes tuples lists."""
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        specs = {kind: PatchSpec.from_dict(spec) for kind, spec in fields.get("patch_specs", {}).items()}
        return cls(**{**fields, "patch_specs": specs})


class ModelFamily(ABC):
    info: ModelInfo
    # the thinker's LoRA adapters (``models/common/programs/adapters.py``); None: the engine has no adapter slots
    adapters: ThinkerAdapters | None = None

    @abstractmethod
    def __init__(self, config: OmniConfig):
        """Load the checkpoint ``config.model.model`` for ``config``'s device, dtype and backends
        (resolved); ``config.family`` is the family's own section (its ``Options``)."""

    @abstractmethod
    def build_stages(self) -> list[Stage]:
        """The engine's stages, upstream first; stage names are what walks list."""

    @abstractmethod
    def new_request(self, request: dict) -> tuple[tuple[str, ...], Any]:
        """A request dict -> (its walk, its state); raises ``InvalidRequestError`` on bad input."""

    @abstractmethod
    def output(self, req: EngineRequest) -> RequestOutput:
        """A finished (or aborted, or failed) request's output."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """Token ids -> text (logprob tokens)."""

    @classmethod
    @abstractmethod
    def make_tiny(cls, out_dir: Path, config: str | Path | dict | None = None, seed: int = 0, **options) -> Path:
        """Write a checkpoint with random weights (``config``: a config.json, a preset name or None for
        the family's tiny one; ``options``: dtype, max_shard_bytes, with_weights)."""

    @classmethod
    @abstractmethod
    def describe(cls, path: str | Path) -> str:
        """A checkpoint's normalised config and sizes, for ``omniwalk inspect``."""
