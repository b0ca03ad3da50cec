"""Request bodies as pydantic models that mirror OpenAI's (chat completions, audio speech).

Parsing is strict (no "0.5" for a float, no 1.0 for an int) and unknown fields are refused, as
OpenAI refuses them; every integer is bounded to what the engine stores it in. JSON is parsed by
pydantic itself (``model_validate_json``), whose parser bounds nesting depth. The project's own
sampling extras are typed here too, and a model family's own fields by the kinds it names
(``with_fields``). ``errors.validation_error`` turns the first failure into a 400 naming the field.
"""

from __future__ import annotations

import functools
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from omniwalk.modality import Modality

INT64_MAX = 2**63 - 1
# A family may draw a second stream with seed + 1, so a seed stays one below int64's maximum.
Seed = Annotated[int, Field(ge=-(2**63), le=INT64_MAX - 1)]
Count = Annotated[int, Field(ge=1, le=2**31 - 1)]  # token / frame counts (int32 in the engine)
NonNegativeCount = Annotated[int, Field(ge=0, le=2**31 - 1)]
TopK = Annotated[int, Field(ge=0, le=2**31 - 1)]
Temperature = Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
Penalty = Annotated[float, Field(gt=0.0, le=100.0, allow_inf_nan=False)]
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=256)]
VoiceName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
# Base64 data and URLs are bounded by the body size; other short strings explicitly.
ShortText = Annotated[str, StringConstraints(max_length=256)]
# OpenAI's rule for function and schema names
FunctionName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
CallId = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Description = Annotated[str, StringConstraints(max_length=8192)]
MAX_TOOLS = 128  # OpenAI's limit on a request's tools (and so on one message's calls)
Pattern = Annotated[str, StringConstraints(min_length=1, max_length=16384)]  # a regex or a grammar's text

AUDIO_FORMATS = ("wav", "pcm16", "flac", "mp3", "opus")


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


# ---- content parts ----


class TextPart(Strict):
    type: Literal["text"]
    text: str


class InputAudio(Strict):
    data: str  # base64
    format: ShortText | None = None  # a hint only: the bytes are sniffed


class InputAudioPart(Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio


class URLRef(Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImageURLPart(Strict):
    type: Literal["image_url"]
    image_url: URLRef | str


class AudioURLPart(Strict):
    type: Literal["audio_url"]
    audio_url: URLRef | str


class VideoURLPart(Strict):
    type: Literal["video_url"]
    video_url: URLRef | str


UserPart = Annotated[
    TextPart | InputAudioPart | ImageURLPart | AudioURLPart | VideoURLPart, Field(discriminator="type")
]
MEDIA_PART_KINDS = {
    "input_audio": Modality.AUDIO,
    "audio_url": Modality.AUDIO,
    "image_url": Modality.IMAGE,
    "video_url": Modality.VIDEO,
}


# ---- messages ----


class SystemMessage(Strict):
    role: Literal["system", "developer"]  # OpenAI's newer name for the system turn
    content: str | list[TextPart]
    name: ShortText | None = None


class UserMessage(Strict):
    role: Literal["user"]
    content: str | Annotated[list[UserPart], Field(min_length=1)]
    name: ShortText | None = None


class AudioRef(Strict):
    id: Annotated[str, StringConstraints(min_length=1, max_length=128)]


class FunctionCall(Strict):
    name: FunctionName
    arguments: str  # JSON text, as the model wrote it


class ToolCall(Strict):
    id: CallId
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(Strict):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    audio: AudioRef | None = None  # a previous answer's audio, by its id (resolved to its transcript)
    name: ShortText | None = None
    refusal: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1, max_length=MAX_TOOLS)] | None = None


class ToolMessage(Strict):
    """A tool's result, answering the assistant's call ``tool_call_id``."""

    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: CallId
    name: ShortText | None = None  # sent by some clients; the call id says which function it was


class FunctionMessage(Strict):
    role: Literal["function"]  # refused: the legacy function-calling API (``tools`` replaced it)
    content: str | None = None
    name: ShortText | None = None


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage, Field(discriminator="role")
]


# ---- the model family's own request fields ----

# kinds a family names for its extra request fields (``ModelInfo.request_fields``)
FIELD_KINDS = {
    "seed": Seed,
    "temperature": Temperature,
    "top_k": TopK,
    "top_p": TopP,
    "penalty": Penalty,
    "count": Count,
    "count0": NonNegativeCount,
    "flag": bool,
}


def with_fields(base: type[Strict], fields: dict[str, str]) -> type[Strict]:
    """``base`` (ChatRequest, SpeechRequest) with the family's fields, optional, typed by kind (built once
    per base and fields: building a pydantic model takes milliseconds)."""
    return _with_fields(base, tuple(sorted(fields.items())))


@functools.cache
def _with_fields(base: type[Strict], fields: tuple[tuple[str, str], ...]) -> type[Strict]:
    return create_model(base.__name__, __base__=base, **{n: (FIELD_KINDS[k] | None, None) for n, k in fields})


class AudioOutput(Strict):
    voice: VoiceName | None = None  # None: the checkpoint's default speaker
    format: Literal[AUDIO_FORMATS] = "wav"  # type: ignore[valid-type]


class StreamOptions(Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # accepted, ignored (nothing is obfuscated)


class JSONSchemaFormat(Strict):
    name: FunctionName
    description: Description | None = None
    # (``schema`` would shadow a pydantic method: the field is named ``schema_``, read as "schema")
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None  # with type "json_schema" (``grammars.constraint_of`` checks)


class StructuredOutputs(Strict):
    """vLLM's extra body field: exactly one of these (``grammars.constraint_of`` checks)."""

    json_: dict | bool | None = Field(None, alias="json")  # a JSON Schema
    regex: Pattern | None = None
    choice: Annotated[list[ShortText], Field(min_length=1, max_length=1024)] | None = None
    grammar: Pattern | None = None  # EBNF (GBNF) or Lark


class Function(Strict):
    name: FunctionName
    description: Description | None = None
    parameters: dict | None = None  # a JSON Schema of the arguments object
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: Function


class FunctionRef(Strict):
    name: FunctionName


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: FunctionRef


class ChatRequest(Strict):
    model: ModelName | None = None
    messages: Annotated[list[Message], Field(min_length=1, max_length=4096)]
    modalities: Annotated[list[Literal["text", "audio"]], Field(min_length=1, max_length=2)] | None = None
    audio: AudioOutput | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = None
    top_p: TopP | None = None
    stop: Annotated[str, StringConstraints(min_length=1)] | Annotated[list[str], Field(max_length=16)] | None = None
    n: Count | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    # omniwalk's extra sampling fields (``extra_body`` in the openai client; the family adds its own)
    seed: Seed | None = None
    top_k: TopK | None = None
    repetition_penalty: Penalty | None = None
    min_tokens: NonNegativeCount | None = None
    ignore_eos: bool | None = None
    # OpenAI fields accepted and ignored (they change nothing a caller can observe here)
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # tools and structured outputs (``structured_outputs``: vLLM's extra field)
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # OpenAI features this server does not have: refused with a 400 that says so when set
    functions: list | None = None
    function_call: str | dict | None = None
    logit_bias: dict | None = None
    prediction: dict | None = None
    reasoning_effort: str | None = None
    web_search_options: dict | None = None


class SpeechRequest(Strict):
    model: ModelName | None = None
    seed: Seed | None = None
    input: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    voice: VoiceName | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: Annotated[float, Field(ge=0.25, le=4.0)] = 1.0
    instructions: str | None = None
    stream_format: Literal["audio", "sse"] | None = None
