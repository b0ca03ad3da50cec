"""The /v1/responses request body as pydantic models that mirror OpenAI's (``ResponseCreateParams``).

Strict as the chat body is (``schemas.Strict``: no coercion, unknown fields refused). Input items
and content parts are told apart by their ``type`` (a message may omit it: it has a ``role``);
a type this server does not serve (file inputs, reasoning items, built-in tools, ...) parses as
``Unsupported`` and is refused by ``responses_api`` with a 400 naming it. The union tags are
capitalised so that ``errors.validation_error`` leaves them out of ``param``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag

from omniwalk.serve import schemas as s
from omniwalk.serve.schemas import Strict

Status = Literal["in_progress", "completed", "incomplete"]


class Unsupported(Strict):
    """An item, part or tool of a type this server does not serve (refused after parsing)."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    type: str


def _tagged(tags: dict[str, str], role_means: str | None = None):
    """A discriminator on ``type``: unknown types -> Unsupported; without one, ``role_means`` for a
    value that has a ``role`` (an input message may leave its type out)."""

    def tag(value: Any) -> str | None:
        get = value.get if isinstance(value, dict) else lambda name: getattr(value, name, None)
        kind = get("type") or (role_means if get("role") is not None else None)
        return None if kind is None else tags.get(kind, "Unsupported")

    what = "a type (or a role)" if role_means else "a type"
    return Discriminator(tag, custom_error_type="missing_type", custom_error_message=f"needs {what}")


# ---- content parts ----


class InputText(Strict):
    type: Literal["input_text"]
    text: str


class OutputText(Strict):
    """An earlier answer's text, sent back as input (what the SDKs do with output items)."""

    type: Literal["output_text"]
    text: str
    annotations: list | None = None
    logprobs: list | None = None


class Refusal(Strict):
    type: Literal["refusal"]
    refusal: str


class InputImage(Strict):
    type: Literal["input_image"]
    image_url: str | None = None  # a data URL (or a URL the operator allows)
    file_id: str | None = None  # refused: there is no Files API here
    detail: Literal["auto", "low", "high", "original"] | None = None


class AudioData(Strict):
    data: str  # base64
    format: Literal["mp3", "wav"] | None = None  # a hint only: the bytes are sniffed


class InputAudio(Strict):
    type: Literal["input_audio"]
    input_audio: AudioData


_PARTS = {"input_text": "InputText", "output_text": "OutputText", "refusal": "Refusal"}
_PARTS |= {"input_image": "InputImage", "input_audio": "InputAudio"}
Part = Annotated[
    Annotated[InputText, Tag("InputText")]
    | Annotated[OutputText, Tag("OutputText")]
    | Annotated[Refusal, Tag("Refusal")]
    | Annotated[InputImage, Tag("InputImage")]
    | Annotated[InputAudio, Tag("InputAudio")]
    | Annotated[Unsupported, Tag("Unsupported")],
    _tagged(_PARTS),
]


# ---- input items ----


class Message(Strict):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Annotated[list[Part], Field(min_length=1)]
    id: s.CallId | None = None
    status: Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCall(Strict):
    type: Literal["function_call"]
    call_id: s.CallId
    name: s.FunctionName
    arguments: str  # JSON text, as the model wrote it
    id: s.CallId | None = None
    status: Status | None = None


class FunctionCallOutput(Strict):
    type: Literal["function_call_output"]
    call_id: s.CallId
    output: str | list[Part]
    id: s.CallId | None = None
    status: Status | None = None


_ITEMS = {"message": "Message", "function_call": "FunctionCall", "function_call_output": "FunctionCallOutput"}


Item = Annotated[
    Annotated[Message, Tag("Message")]
    | Annotated[FunctionCall, Tag("FunctionCall")]
    | Annotated[FunctionCallOutput, Tag("FunctionCallOutput")]
    | Annotated[Unsupported, Tag("Unsupported")],
    _tagged(_ITEMS, role_means="message"),
]


# ---- tools, tool choice, text format ----


class FunctionTool(Strict):
    type: Literal["function"]
    name: s.FunctionName
    description: s.Description | None = None
    parameters: dict | None = None  # a JSON Schema of the arguments object
    strict: bool | None = None


Tool = Annotated[
    Annotated[FunctionTool, Tag("FunctionTool")] | Annotated[Unsupported, Tag("Unsupported")],
    _tagged({"function": "FunctionTool"}),
]


class FunctionChoice(Strict):
    type: Literal["function"]
    name: s.FunctionName


ToolChoice = Annotated[
    Annotated[FunctionChoice, Tag("FunctionChoice")] | Annotated[Unsupported, Tag("Unsupported")],
    _tagged({"function": "FunctionChoice"}),
]


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: s.FunctionName | None = None  # json_schema's
    description: s.Description | None = None
    # (``schema`` would shadow a pydantic method: the field is named ``schema_``, read as "schema")
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, ignored


class StreamOptions(Strict):
    include_obfuscation: bool | None = None  # accepted, ignored (nothing is obfuscated)


class ResponsesRequest(Strict):
    model: s.ModelName | None = None
    input: Annotated[str, Field(min_length=1)] | Annotated[list[Item], Field(min_length=1, max_length=4096)]
    instructions: str | None = None
    tools: Annotated[list[Tool], Field(max_length=s.MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: s.Count | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = None
    top_p: s.TopP | None = None
    store: bool | None = None
    previous_response_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    # omniwalk's extra sampling fields (``extra_body`` in the openai client; the family adds its own)
    seed: s.Seed | None = None
    top_k: s.TopK | None = None
    repetition_penalty: s.Penalty | None = None
    min_tokens: s.NonNegativeCount | None = None
    ignore_eos: bool | None = None
    stop: Annotated[str, Field(min_length=1)] | Annotated[list[str], Field(max_length=16)] | None = None
    # OpenAI fields accepted and ignored (they change nothing a caller can observe here)
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: Annotated[list[str], Field(max_length=0)] | None = None  # nothing extra to include here
    # OpenAI features this server does not have: refused with a 400 that says so when set
    background: bool | None = None
    reasoning: dict | None = None
    conversation: str | dict | None = None
    prompt: dict | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    context_management: list | None = None
