"""A session's settings: what ``session.update`` changes and ``session.created`` / ``updated`` show.

One set of fields whatever the dialect; ``apply`` reads both spellings (GA ``audio.input.*``,
``output_modalities``, ``max_output_tokens``; beta ``input_audio_format``, ``modalities``,
``voice``, ``turn_detection``, ``max_response_output_tokens``) and ``to_json`` writes the client's.
Only fields present in an update change (an explicit ``null`` turns turn detection off). A field
this server cannot honour is refused alone, naming it, and the rest of the update applies: audio
other than PCM16 at 24 kHz, noise reduction, a speed other than 1.0, an unknown voice (OpenAI's
voice names are aliases: ``voice_aliases.py``). Turn detection: ``turn_detection.py``. Tools and
``tool_choice`` are checked (``tools.py``) and kept in realtime's shape. Transcription, whatever
model it names, is done by the served model (``transcription.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from omniwalk.config import ServerConfig
from omniwalk.serve import openai_api as api
from omniwalk.serve.errors import APIError, bad_request, unsupported
from omniwalk.serve.realtime import protocol as p
from omniwalk.serve.realtime.tools import ToolChoice, check_tools, tool_choice_json, tools_json
from omniwalk.serve.realtime.turn_detection import TurnDetection, turn_detection
from omniwalk.serve.realtime.vad import VADParams

PCM = {"type": "audio/pcm", "rate": 24000}
SAMPLING = tuple(p.Sampling.model_fields)


@dataclass
class Settings:
    id: str
    model: str
    expires_at: int
    instructions: str = ""  # "": the model's default system prompt
    speaks: bool = True  # output audio + its transcript (False: text only)
    voice: str | None = None  # None: the checkpoint's default speaker
    turn_detection: TurnDetection | None = None
    max_output_tokens: int | None = None  # None: the server's default_max_tokens
    sampling: dict = field(default_factory=dict)  # omniwalk's sampling fields set on the session
    transcription: dict | None = None  # {"model", ...}: user audio is transcribed (``transcription.py``)
    tools: list[p.FunctionTool] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    vad_defaults: VADParams = VADParams()  # the server's (turning VAD on starts from these)

    @classmethod
    def defaults(cls, cfg: ServerConfig, model: str, expires_at: int) -> Settings:
        vad = VADParams(
            cfg.realtime_vad_threshold,
            cfg.realtime_vad_prefix_padding_ms,
            cfg.realtime_vad_silence_ms,
            cfg.realtime_vad_window_ms,
            cfg.realtime_vad_aggressiveness,
            cfg.realtime_vad_end_padding_ms,
            cfg.realtime_preemptive_silence_ms or None,
        )
        return cls(p.new_id("sess"), model, expires_at, turn_detection=TurnDetection(vad), vad_defaults=vad)

    def updated(self, update: p.SessionFields, context: api.Context) -> tuple[Settings, list[APIError]]:
        """These settings with what ``update`` sets, and the errors of the fields it could not set:
        each field (or group of fields that go together) is refused alone, the others apply."""
        new = dataclasses.replace(self, sampling=dict(self.sampling))
        refused = []
        for step in _STEPS:
            try:
                step(new, update, context)
            except APIError as e:
                refused.append(e)
        return new, refused

    def to_json(self, is_beta: bool) -> dict:
        td = self.turn_detection.to_json() if self.turn_detection else None
        tokens = self.max_output_tokens or "inf"
        common = {
            "id": self.id,
            "object": "realtime.session",
            "model": self.model,
            "instructions": self.instructions,
            "tools": tools_json(self.tools),
            "tool_choice": tool_choice_json(self.tool_choice),
            "expires_at": self.expires_at,
            **self.sampling,
        }
        if is_beta:
            return {
                **common,
                "modalities": ["text", "audio"] if self.speaks else ["text"],
                "voice": self.voice,
                "input_audio_format": "pcm16",
                "output_audio_format": "pcm16",
                "turn_detection": td,
                "input_audio_transcription": self.transcription,
                "max_response_output_tokens": tokens,
            }
        audio = {
            "input": {
                "format": PCM,
                "turn_detection": td,
                "transcription": self.transcription,
                "noise_reduction": None,
            },
            "output": {"format": PCM, "voice": self.voice, "speed": 1.0},
        }
        return {
            **common,
            "type": "realtime",
            "output_modalities": ["audio"] if self.speaks else ["text"],
            "audio": audio,
            "max_output_tokens": tokens,
        }


def output_speaks(fields: p.ResponseFields, where: str) -> bool | None:
    """GA ``output_modalities`` (["audio"] or ["text"]) or beta ``modalities`` -> speaks (None: not set)."""
    for name in ("output_modalities", "modalities"):
        value = getattr(fields, name)
        if value is not None:
            if not value:
                raise bad_request(f"{where}.{name} must not be empty", f"{where}.{name}")
            return "audio" in value
    return None


def output_voice(fields: p.ResponseFields, context: api.Context, where: str) -> str | None:
    """The voice ``fields`` set (None: not set), as the client named it: a voice of the checkpoint or
    an alias (``voice_aliases.py``; the engine request resolves it)."""
    output = fields.audio.output if fields.audio else None
    voice, param = (fields.voice, f"{where}.voice") if fields.voice is not None else (None, None)
    if output is not None and output.voice is not None:
        voice, param = output.voice, f"{where}.audio.output.voice"
    if isinstance(voice, dict):
        raise bad_request("custom voices are not served; name one", param, "unsupported_value")
    context.voice(voice, param)
    return voice.lower() if voice is not None else None


def check_output_format(fields: p.ResponseFields, where: str) -> None:
    """The output audio's format and speed: PCM16 at 24 kHz, speed 1.0."""
    output = fields.audio.output if fields.audio else None
    if output is not None and output.format is not None:
        _check_pcm(output.format, f"{where}.audio.output.format")
    if output is not None and output.speed not in (None, 1.0):
        raise bad_request("only speed 1.0 is served", f"{where}.audio.output.speed", "unsupported_value")
    if fields.output_audio_format not in (None, "pcm16"):
        raise _bad_format(fields.output_audio_format, f"{where}.output_audio_format")


def output_max_tokens(fields: p.ResponseFields):
    """GA ``max_output_tokens`` or beta ``max_response_output_tokens`` -> int, None ("inf") or ... (not set)."""
    for name in ("max_output_tokens", "max_response_output_tokens"):
        if name in fields.model_fields_set:
            value = getattr(fields, name)
            return None if value in (None, "inf") else value
    return ...


def check_response_refused(fields: p.ResponseFields, where: str) -> None:
    if fields.conversation not in (None, "auto"):
        raise unsupported(f"{where}.conversation", "out-of-band responses (conversation other than 'auto')")
    if fields.input is not None:
        raise unsupported(f"{where}.input", "out-of-band input")


def _refuse(name: str, what: str):
    def step(new: Settings, update: p.SessionFields, context: api.Context) -> None:
        value = update
        for key in name.split("."):
            value = getattr(value, key, None)
        if value:
            raise unsupported(f"session.{name}", what)

    return step


def _refuse_response_fields(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    check_response_refused(update, "session")


def _set_speed(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    if update.speed not in (None, 1.0):
        raise bad_request("only speed 1.0 is served", "session.speed", "unsupported_value")


def _set_instructions(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    if "instructions" in update.model_fields_set:
        new.instructions = update.instructions or ""


def _set_modalities(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    speaks = output_speaks(update, "session")
    new.speaks = new.speaks if speaks is None else speaks


def _set_output_format(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    check_output_format(update, "session")


def _set_voice(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    voice = output_voice(update, context, "session")
    new.voice = new.voice if voice is None else voice


def _set_max_tokens(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    tokens = output_max_tokens(update)
    new.max_output_tokens = new.max_output_tokens if tokens is ... else tokens


def _set_input_format(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    _check_input_format(update)


def _set_turn_detection(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    audio_input = update.audio.input if update.audio else None
    if "turn_detection" in update.model_fields_set:
        td, where = update.turn_detection, "session.turn_detection"
    elif audio_input and "turn_detection" in audio_input.model_fields_set:
        td, where = audio_input.turn_detection, "session.audio.input.turn_detection"
    else:
        return
    new.turn_detection = turn_detection(td, new.turn_detection, new.vad_defaults, where)


def _set_sampling(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    given = update.model_fields_set
    new.sampling.update({k: getattr(update, k) for k in SAMPLING if k in given} | (update.model_extra or {}))


def _set_tools(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    given = update.model_fields_set
    tools = list(update.tools or []) if "tools" in given else new.tools
    choice = (update.tool_choice or "auto") if "tool_choice" in given else new.tool_choice
    check_tools(tools, choice, "session")
    new.tools, new.tool_choice = tools, choice


def _set_transcription(new: Settings, update: p.SessionFields, context: api.Context) -> None:
    audio_input = update.audio.input if update.audio else None
    if "input_audio_transcription" in update.model_fields_set:
        new.transcription = update.input_audio_transcription
    elif audio_input and "transcription" in audio_input.model_fields_set:
        new.transcription = audio_input.transcription


def _check_input_format(update: p.SessionFields) -> None:
    if update.input_audio_format not in (None, "pcm16"):
        raise _bad_format(update.input_audio_format, "session.input_audio_format")
    fmt = update.audio.input.format if update.audio and update.audio.input else None
    if fmt is not None:
        _check_pcm(fmt, "session.audio.input.format")


def _check_pcm(fmt: p.AudioFormat, param: str) -> None:
    if fmt.type not in (None, "audio/pcm") or fmt.rate not in (None, 24000):
        raise _bad_format(f"{fmt.type} at {fmt.rate} Hz", param)


def _bad_format(name: str, param: str):
    return bad_request(
        f"audio format {name!r} is not served; use PCM16 at 24 kHz ('audio/pcm' / 'pcm16')", param, "unsupported_value"
    )


_STEPS = (
    _refuse_response_fields,
    _refuse("input_audio_noise_reduction", "input audio noise reduction"),
    _refuse("audio.input.noise_reduction", "noise reduction"),
    _refuse("prompt", "prompt"),
    _set_speed,
    _set_instructions,
    _set_modalities,
    _set_output_format,
    _set_voice,
    _set_max_tokens,
    _set_input_format,
    _set_turn_detection,
    _set_sampling,
    _set_tools,
    _set_transcription,
)
