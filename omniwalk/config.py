"""Engine and model knobs as frozen dataclasses: one source of truth, no environment variables.

    OmniConfig = ModelConfig   the checkpoint and how its networks run (device, dtype, backends)
               + EngineConfig  the walk runtime: KV pages, token budget, admission, CUDA graphs
               + MediaLimits   what a request's media may be
               + family        the model family's own section (its ``Options``: per-stage budgets)

``OmniConfig.from_kwargs`` builds it from flat keyword arguments (``Omni(model, **options)``, the
``omniwalk serve`` flags) and ``resolve_auto`` fixes every "auto" choice for the device, once, so
the engine and the family read plain values. ``ServerConfig`` holds the HTTP server's knobs.
Values are validated here, with errors that name the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from omniwalk.errors import ConfigError
from omniwalk.kernels.registry import REGISTRIES
from omniwalk.media.limits import MediaLimits

# (torch is imported where a dtype or device is used, so that `omniwalk --help` does not load it)
DTYPES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "fp8")
MOE_ROUTINGS = ("model", "balanced")  # layers/moe.ROUTINGS
MIN_GRAPH_TOKENS = 256  # the smallest packed-graph bucket (engine/packed_graphs.py)
DEFAULT_MAX_LORAS = 4  # adapter slots when adapters are given (``EngineConfig.loras``, a server's adapter root)


@dataclass(frozen=True)
class SpeechCap:
    """The frames a talker may draw for an answer's text (``ModelConfig.speech_s_per_text_token``): speech
    follows the talker's end code, which random weights (or a runaway talker) never draw; a trained
    talker says a text token in ~0.3-0.5 s, so this cap stops such speech near the text's length and
    never cuts a trained talker's."""

    s_per_text_token: float = 1.0
    margin_s: float = 2.0

    def max_frames(self, num_text_tokens: int, frames_per_s: float) -> int | None:
        """Frames allowed for ``num_text_tokens`` of text at the codec's ``frames_per_s``; None: no cap."""
        if self.s_per_text_token == 0:
            return None
        return math.ceil((num_text_tokens * self.s_per_text_token + self.margin_s) * frames_per_s)


@dataclass(frozen=True)
class ModelConfig:
    model: str  # checkpoint directory (config.json, safetensors, tokenizer.json, chat template)
    device: str = "cpu"
    dtype: str = "float32"
    max_model_len: int | None = None  # prompt + generated tokens; None = the checkpoint's max positions
    # the system turn of a request without one; None = the model family's own, "" = none
    default_system_prompt: str | None = None
    random_weights: bool = False  # build random weights on the device instead of reading them (benchmarks)
    hf_cache: str | None = None  # the Hugging Face cache a model id is found in; None: huggingface_hub's
    # Fast paths: each field names an entry of its registry (omniwalk/kernels/registry.py); "auto" takes
    # the fast one where it runs (CUDA), the reference one elsewhere (``resolve_auto``):
    # MoE: "reference" (per-expert loop, the CPU oracle) | "fused" (CUDA: routing kernel, expert GEMVs
    # at decode sizes, grouped GEMM at many tokens per expert; kernels/fused_moe.py)
    moe_backend: str = "auto"
    # encoders' and prefill attention: "reference" | "masked" | "torch_varlen" (CUDA, 16-bit)
    attention_backend: str = "auto"
    decode_attention: str = "auto"  # paged decode attention: "reference" | "triton" (CUDA)
    # decoder kernels: "reference" | "fused" (CUDA: fused add + RMSNorm, merged q/k/v and gate/up skinny
    # GEMMs, q/k norm + rope + KV store in one kernel, and the encoders' and DiT's merged projections)
    decoder_kernels: str = "auto"
    # LoRA adapters' batched delta after a thinker projection (omniwalk/lora/ops.py): "reference" | "triton" (CUDA)
    lora_backend: str = "auto"
    # a small batch's decode step in one launch of a persistent kernel: "reference" (layer by layer) | "triton"
    # (CUDA; today the code predictor's frame of up to 4 requests, kernels/persistent.py) | "cuda" (the same
    # frame as a CUDA kernel, bf16, kernels/cuda_frame.py); "auto" is the reference until a kernel is measured
    # faster on a GPU
    persistent_decode: str = "auto"
    # "fp8": decoder projections and experts of the thinker and talker in FP8 (e4m3, 128x128 block
    # scales; an FP8 checkpoint's as stored, else quantised at load); "none": the model dtype throughout
    quantization: str = "none"
    # More than one GPU (omniwalk/parallel/): stages on devices of their own ("thinker=cuda:0,talker=cuda:1";
    # stages not named run on ``device``), and the thinker's weights split over this many ranks (one process each)
    placement: str = ""
    tensor_parallel: int = 1
    # Benchmarks only: "balanced" makes every MoE layer draw each token's top-k experts uniformly (seeded by
    # ``moe_routing_seed``; gate weights the router's probabilities of the drawn experts) instead of taking its
    # router's top-k, so that batched steps read as many experts as a trained, load-balanced router makes
    # them read (random weights concentrate on a few); "model": the router's own choice (layers/moe.py)
    moe_routing: str = "model"
    moe_routing_seed: int = 0
    # Speech as long as its text: a talker stops after speech_s_per_text_token seconds per token of the answer's
    # text plus speech_margin_s (``SpeechCap``; a request's max_audio_frames still bounds it, its min_audio_frames
    # raises it); 0 = no cap from the text. The default is ~2x the slowest deliberate speech (docs/performance.md)
    speech_s_per_text_token: float = SpeechCap.s_per_text_token
    speech_margin_s: float = SpeechCap.margin_s

    def __post_init__(self):
        import torch

        from omniwalk.parallel.placement import parse_placement

        for name, choices in backend_choices().items():
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name} must be one of {list(choices)}, got {getattr(self, name)!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"quantization must be one of {list(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        try:
            torch.device(self.device)
        except RuntimeError:
            raise ConfigError(f"device {self.device!r} is not a torch device") from None
        parse_placement(self.placement, self.device)
        if self.tensor_parallel < 1:
            raise ConfigError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        if self.tensor_parallel > 1 and self.quantization != "none":
            raise ConfigError("quantization with tensor_parallel > 1 is not supported yet (FP8 blocks are not sharded)")
        if self.moe_routing not in MOE_ROUTINGS:
            raise ConfigError(f"moe_routing must be one of {list(MOE_ROUTINGS)}, got {self.moe_routing!r}")
        for name in ("speech_s_per_text_token", "speech_margin_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")

    def device_of(self, stage: str) -> str:
        """The device ``stage`` runs on (``placement``, else ``device``)."""
        from omniwalk.parallel.placement import parse_placement

        return parse_placement(self.placement, self.device).get(stage, self.device)

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    @property
    def on_cuda(self) -> bool:
        import torch

        return torch.device(self.device).type == "cuda"

    @property
    def speech_cap(self) -> SpeechCap:
        return SpeechCap(self.speech_s_per_text_token, self.speech_margin_s)


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling, memory and graph knobs of the walk runtime (one tested default each)."""

    page_size: int = 16  # tokens per KV page
    # per step and KV stage: prefill chunk tokens + decode tokens; 0 = sized to the device (``resolve_auto``)
    max_batch_tokens: int = 0
    max_running: int = 64  # requests holding KV pages in one KV stage (also streams in a stream pool)
    max_requests: int = 256  # unfinished requests admitted; beyond that: QueueFullError
    # on CUDA, decode steps (and batched stream calls) of up to this many requests replay graphs; 0 = all eager
    cuda_graph_max_batch: int = 64
    # on CUDA with graphs on, encoder calls of up to this many packed tokens replay graphs of their
    # layer loops; 0 = encoders run eagerly
    encoder_graph_max_tokens: int = 8192
    # on CUDA with graphs on, prefill steps of up to this many tokens (and at most the stage's token
    # budget) replay graphs of their decoder layers; 0 = eager
    prefill_graph_max_tokens: int = 2048
    # a request's prompt starts from the KV pages an earlier request computed for the same prefix (ids,
    # positions and media content: the system prompt, a conversation's earlier turns), kept until the
    # pages are needed (docs/serving.md)
    prefix_cache: bool = True
    # a served request's text goes out (one delta, one SSE chunk) once this many text pieces are held, and
    # before its audio or its end; its first at once. 1 streams every token; N divides the HTTP process's
    # (or Ray ingress's) per-chunk work by N, for text that arrives in bursts
    stream_interval: int = 1
    # structured outputs: compiled grammars kept (keyed by content), the threads that compile them off
    # the engine loop, and the seconds a compile may take before its request fails
    grammar_cache_size: int = 256
    grammar_threads: int = 2
    grammar_timeout_s: float = 10.0
    # LoRA adapters of the thinker (omniwalk/lora/): device slots holding adapters' weights at once (0 = adapters
    # off; requests then pay nothing for them), the largest rank an adapter may have, and adapters loaded at
    # start-up, each "NAME=PATH" (a PEFT adapter directory; ``--lora``); none given with slots 0: 4 slots
    max_loras: int = 0
    max_lora_rank: int = 16
    loras: tuple[str, ...] = field(default=(), metadata={"flag": "--lora", "metavar": "NAME=PATH"})

    def __post_init__(self):
        object.__setattr__(self, "loras", tuple(self.loras))  # (a list given in Python)
        for f in fields(self):
            if isinstance(getattr(self, f.name), bool | tuple):
                continue
            least = 0 if f.name in ("max_batch_tokens", "max_loras") or "graph" in f.name else 1
            if getattr(self, f.name) < least:
                raise ConfigError(f"{f.name} must be >= {least}, got {getattr(self, f.name)}")
        for name in ("encoder_graph_max_tokens", "prefill_graph_max_tokens"):
            n = getattr(self, name)
            if n and (n < MIN_GRAPH_TOKENS or n & (n - 1)):
                raise ConfigError(f"{name} must be 0 or a power of two >= {MIN_GRAPH_TOKENS}, got {n}")
        for spec in self.loras:
            name, _, path = spec.partition("=")
            if not name or not path:
                raise ConfigError(f"loras: {spec!r} is not NAME=PATH")


@dataclass(frozen=True)
class OmniConfig:
    model: ModelConfig = field(default_factory=lambda: ModelConfig(model=""))
    engine: EngineConfig = field(default_factory=EngineConfig)
    media: MediaLimits = field(default_factory=MediaLimits)
    family: Any = None  # the model family's ``Options`` (None: it has none)

    @classmethod
    def from_kwargs(cls, family_options: type | None = None, **kwargs) -> OmniConfig:
        """Keyword arguments named after ``ModelConfig``, ``EngineConfig``, ``MediaLimits`` or
        ``family_options`` (the model family's ``Options``) fields -> the config, resolved
        (``resolve_auto``); unknown names are errors."""
        parts = {"model": ModelConfig, "engine": EngineConfig, "media": MediaLimits, "family": family_options}
        names = {key: {f.name for f in fields(c)} if c else set() for key, c in parts.items()}
        unknown = sorted(set(kwargs) - set().union(*names.values()))
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown}; known: {sorted(set().union(*names.values()))}")
        built = {key: c(**{k: v for k, v in kwargs.items() if k in names[key]}) for key, c in parts.items() if c}
        return resolve_auto(cls(**built))


def resolve_auto(config: OmniConfig) -> OmniConfig:
    """``config`` with every choice left to the device made: "auto" fast paths (the first entry of each
    registry's preference that runs on the device, ``Registry.resolve``), the device-sized token budget,
    and graph limits (0 off CUDA; packed graphs also need the varlen attention, the reference one reads
    segment bounds on the host)."""
    model, engine = config.model, config.engine
    backends = {name: r.resolve(getattr(model, name), model.device, model.dtype) for name, r in REGISTRIES.items()}
    graphs = engine.cuda_graph_max_batch if model.on_cuda else 0
    packed = graphs and backends["attention_backend"] != "reference"
    engine = replace(
        engine,
        max_batch_tokens=engine.max_batch_tokens or batch_tokens_for(model),
        cuda_graph_max_batch=graphs,
        encoder_graph_max_tokens=engine.encoder_graph_max_tokens if packed else 0,
        prefill_graph_max_tokens=engine.prefill_graph_max_tokens if packed else 0,
        max_loras=engine.max_loras or (DEFAULT_MAX_LORAS if engine.loras else 0),
    )
    return replace(config, model=replace(model, **backends), engine=engine)


def backend_choices() -> dict[str, tuple[str, ...]]:
    """Each fast-path field -> the values it takes (its registry's entries and "auto")."""
    return {name: registry.choices() for name, registry in REGISTRIES.items()}


def batch_tokens_for(model: ModelConfig) -> int:
    """The default per-step token budget of a KV stage. On the CPU 512 keeps a step short. On a GPU
    1024: a long step delays every request in it and every arrival behind it, so a burst is admitted
    in steps of about three image prompts or ten 4 s audio prompts beside the decodes; a burst of image
    prompts gets its first tokens sooner at 1024 than at 2048 or 4096, for the same throughput
    (docs/performance.md)."""
    return 1024 if model.on_cuda else 512


@dataclass(frozen=True)
class RoutingConfig:
    """How requests are spread over engine replicas (``omniwalk/serve/routing.py``, the one policy)."""

    # a request with an affinity key (a realtime session, a chat's prefix) goes to the replica that holds its
    # prefix pages (rendezvous hash of the key), unless that replica is saturated; else to the least loaded
    affinity: bool = True
    # a replica with this many unfinished requests or more is saturated (by default: as many as one engine runs)
    saturation: int = EngineConfig.max_running
    # ... and so is one with more than this many unfinished requests beyond the least loaded replica's (the
    # fleet simulator's best TTFT at 64 replicas, loads 0.7-1.2: docs/deploy.md)
    max_excess: int = 8

    def __post_init__(self):
        if self.saturation < 1:
            raise ConfigError(f"routing_saturation must be >= 1, got {self.saturation}")
        if self.max_excess < 0:
            raise ConfigError(f"routing_max_excess must be >= 0, got {self.max_excess}")


@dataclass(frozen=True)
class RayConfig:
    """``omniwalk serve --ray ADDRESS``: the server as a Ray Serve application (``omniwalk/serve/ray/``):
    ingress replicas (the HTTP app) in front of engine replicas (one engine process each). The number of
    engine replicas is ``ServerConfig.data_parallel``, or autoscaled between ``ray_min_replicas`` and
    ``ray_max_replicas`` when the maximum is set."""

    # the Ray cluster: "auto" (the one this node belongs to: ``ray start`` ran), "local" (start one here),
    # or an address (host:port, ray://host:port); "" = no Ray (the plain server)
    ray: str = ""
    ray_app_name: str = "omniwalk"
    ray_ingress_replicas: int = 1
    ray_ingress_num_cpus: float = 1.0
    ray_engine_num_cpus: float = 1.0  # per engine replica (its GPUs follow from device and tensor_parallel)
    # autoscaling on unfinished requests per engine replica (0 max: a fixed data_parallel replicas)
    ray_min_replicas: int = 1
    ray_max_replicas: int = 0
    ray_target_ongoing_requests: float = 16.0
    ray_upscale_delay_s: float = 5.0
    ray_downscale_delay_s: float = 30.0
    ray_autoscaling_window_s: float = 30.0  # the load is averaged over this long (Ray's look_back_period_s)
    ray_max_ongoing_requests: int = 256  # per engine replica; Ray queues beyond it (EngineConfig.max_requests)
    # an engine replica whose engine process is gone fails its health check; Ray replaces it
    ray_health_check_period_s: float = 2.0
    # a request that had no output when its replica failed is sent to another one for this long
    ray_retry_timeout_s: float = 30.0

    def __post_init__(self):
        for name in ("ray_ingress_replicas", "ray_min_replicas", "ray_max_ongoing_requests"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.ray_max_replicas and self.ray_max_replicas < self.ray_min_replicas:
            raise ConfigError(
                f"ray_max_replicas ({self.ray_max_replicas}) must be 0 (no autoscaling) or >= ray_min_replicas "
                f"({self.ray_min_replicas})"
            )
        positive = ("ray_target_ongoing_requests", "ray_health_check_period_s", "ray_retry_timeout_s")
        positive += ("ray_autoscaling_window_s",)
        for name in positive + ("ray_ingress_num_cpus",):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("ray_engine_num_cpus", "ray_upscale_delay_s", "ray_downscale_delay_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def autoscales(self) -> bool:
        return self.ray_max_replicas > 0


LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP server's knobs (``omniwalk serve`` flags are generated from these fields)."""

    host: str = "127.0.0.1"
    port: int = 8000
    # when set, requests need "Authorization: Bearer <key>"; a flag shows in ``ps``: prefer api_key_file or
    # the OMNIWALK_API_KEY environment variable (a secret, so the environment may carry it)
    api_key: str | None = None
    api_key_file: str | None = None  # a file whose first line is the API key (the CLI reads it into api_key)
    # Origins (scheme://host[:port], comma-separated) a browser may open /v1/realtime from besides the
    # server's own; a handshake with another Origin header is refused with 403 (clients without one pass)
    allowed_origins: str = ""
    header_timeout_s: float = 10.0  # a request's headers must be complete this long after it starts: else 408
    body_timeout_s: float = 30.0  # its whole body must arrive this long after its headers: else 408
    # open connections (HTTP and WebSocket); a request on one beyond it is answered 503
    max_connections: int = 1024
    served_model_name: str | None = None  # the name requests give as "model"; None = the model family's
    max_body_bytes: int = 64 * 2**20  # larger bodies: 413, refused from Content-Length or while read
    max_tokens_limit: int = 8192  # requests asking for more: 400
    max_audio_frames_limit: int = 4096  # 12.5 frames per second of speech: ~5.5 minutes
    default_max_tokens: int = 512  # when a request names none
    # a request's output grammar (response_format, structured_outputs, tools) is checked off the event loop
    # within this long before the request is queued; one that takes longer is a 400
    grammar_check_timeout_s: float = 10.0
    # "info" adds an access log line per response (request id, route, status, duration)
    log_level: str = field(default="warning", metadata={"choices": LOG_LEVELS})
    # SIGTERM: requests in flight may finish for this long; then they are aborted and the server exits
    shutdown_grace_s: float = 30.0
    # engine processes behind this server (replicas of the whole model, each on GPUs of its own: replica r's
    # devices are the placement's shifted past the replicas before it); requests go to the least loaded
    data_parallel: int = 1
    media_workers: int = 2  # threads decoding media bytes in the HTTP process (the codecs release the GIL)
    max_media_queue: int = 64  # media items waiting for a worker; beyond that: 429
    # assistant audio a later request may reference by id ({"audio": {"id"}}): the newest this many
    # answers' transcripts, each until its expires_at
    audio_store_size: int = 1024
    audio_expiry_s: int = 3600
    # stored /v1/responses (retrieve, previous_response_id): the newest this many, each this long, their inputs
    # (media included) and outputs together at most this many bytes
    response_store_size: int = 1024
    response_expiry_s: int = 3600
    response_store_bytes: int = 256 * 2**20
    # /v1/realtime (WebSocket sessions, omniwalk/serve/realtime/): limits, and the server VAD's defaults
    # (a session changes threshold, prefix padding and silence with session.update)
    realtime_max_sessions: int = 64  # open sessions; the next handshake is refused with a 429
    realtime_max_session_s: float = 1800.0  # then the session gets an "error" event and is closed
    realtime_max_append_bytes: int = 4 * 2**20  # decoded audio per input_audio_buffer.append (87 s of PCM16)
    realtime_max_buffer_s: float = 600.0  # audio the input buffer holds until it is committed
    # a session's conversation: past either bound its oldest items are dropped (conversation.item.deleted)
    realtime_max_conversation_audio_s: float = 600.0  # seconds of audio in its items (28.8 MB of PCM16)
    realtime_max_conversation_bytes: int = 32 * 2**20  # audio + text of its items (+256 bytes an item)
    # conversation audio all sessions hold together; an item past it is refused with an "error" event
    realtime_max_total_audio_bytes: int = 2**30
    realtime_idle_timeout_s: float = 300.0  # no client event this long (no answer playing): "error" event, close
    realtime_vad_threshold: float = 0.5  # fraction of voiced 20 ms frames in the window that is speech
    realtime_vad_window_ms: int = 300  # the window those votes are counted over (a multiple of 20)
    realtime_vad_prefix_padding_ms: int = 300  # audio kept before the detected start of speech
    realtime_vad_silence_ms: int = 500  # quiet this long ends a turn
    realtime_vad_aggressiveness: int = 3  # WebRTC VAD mode, 0 (least) to 3 (most eager to call a frame silence)
    realtime_vad_end_padding_ms: int = 200  # audio a turn keeps after its last voiced frame (at most the silence)
    # preemptive answers: after this much quiet (a tentative end of turn) the answer starts in the engine, unsent;
    # it is released when the turn is confirmed and dropped unseen if speech resumes. A session's
    # turn_detection.preemptive_silence_ms overrides it; 0 turns it off
    realtime_preemptive_silence_ms: int = 200
    # a tentative end of turn prepares its answer only while fewer realtime responses than this (prepared or not,
    # all sessions of the process) are being generated; else the confirmed turn starts it. 0: no limit
    realtime_preemption_max_responses: int = 16
    # a session's audio item waits this long for a place in a full media queue (max_media_queue) before its
    # response or transcription fails with the 429's error event; 0: no wait
    realtime_max_media_wait_s: float = 5.0
    # the directory POST /v1/load_lora_adapter may load adapters from (paths outside it are refused); None: the
    # API loads none (adapters come from ``--lora`` only)
    lora_root: str | None = None
    # OpenAI voice names -> the checkpoint's voices: "NAME=VOICE" entries (``--voice-alias ash=ethan``, repeatable)
    # over the default table (serve/voice_aliases.py: each OpenAI voice to a like voice of the checkpoint); an entry
    # naming a voice the checkpoint lacks stops the server at start-up
    voice_aliases: tuple[str, ...] = field(default=(), metadata={"flag": "--voice-alias", "metavar": "NAME=VOICE"})
    # routing over the replicas (``RoutingConfig``, read as ``ServerConfig.routing``; flat fields give the flags)
    routing_affinity: bool = RoutingConfig.affinity
    routing_saturation: int = RoutingConfig.saturation
    routing_max_excess: int = RoutingConfig.max_excess

    def __post_init__(self):
        positive = ("port", "max_body_bytes", "max_tokens_limit", "max_audio_frames_limit", "default_max_tokens")
        positive += ("data_parallel", "media_workers", "max_media_queue", "audio_store_size", "audio_expiry_s")
        positive += ("max_connections", "response_store_size", "response_expiry_s", "response_store_bytes")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.port > 65535:
            raise ConfigError(f"port must be <= 65535, got {self.port}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {list(LOG_LEVELS)}, got {self.log_level!r}")
        if self.shutdown_grace_s < 0:
            raise ConfigError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise ConfigError(f"{name} must be in (0, 3600], got {getattr(self, name)}")
        for origin in filter(None, (o.strip() for o in self.allowed_origins.split(","))):
            if not origin.startswith(("http://", "https://")) or origin.count("/") != 2:
                raise ConfigError(f"allowed_origins: {origin!r} is not an origin (scheme://host[:port])")
        self._check_realtime()
        for entry in self.voice_aliases:
            name, _, voice = entry.partition("=")
            if not name.strip() or not voice.strip():
                raise ConfigError(f"voice_aliases: {entry!r} is not NAME=VOICE (e.g. ash=ethan)")
        self.routing  # noqa: B018 (builds it: validates the routing fields)

    @property
    def routing(self) -> RoutingConfig:
        return RoutingConfig(
            affinity=self.routing_affinity, saturation=self.routing_saturation, max_excess=self.routing_max_excess
        )

    def _check_realtime(self) -> None:
        ints = ("realtime_max_sessions", "realtime_max_append_bytes", "realtime_vad_silence_ms")
        for name in ints + ("realtime_max_conversation_bytes", "realtime_max_total_audio_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        seconds = ("realtime_max_session_s", "realtime_max_buffer_s", "realtime_max_conversation_audio_s")
        for name in seconds + ("realtime_idle_timeout_s",):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.realtime_vad_threshold <= 1.0:
            raise ConfigError(f"realtime_vad_threshold must be in [0, 1], got {self.realtime_vad_threshold}")
        if self.realtime_vad_window_ms < 20 or self.realtime_vad_window_ms % 20:
            raise ConfigError(f"realtime_vad_window_ms must be a multiple of 20, got {self.realtime_vad_window_ms}")
        if self.realtime_vad_prefix_padding_ms < 0:
            raise ConfigError(f"realtime_vad_prefix_padding_ms must be >= 0, got {self.realtime_vad_prefix_padding_ms}")
        counts = ("realtime_vad_end_padding_ms", "realtime_preemptive_silence_ms", "realtime_preemption_max_responses")
        counts += ("realtime_max_media_wait_s",)
        for name in counts:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.realtime_vad_aggressiveness not in (0, 1, 2, 3):
            raise ConfigError(f"realtime_vad_aggressiveness must be 0-3, got {self.realtime_vad_aggressiveness}")
