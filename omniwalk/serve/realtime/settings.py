"""A session's settings: what ``session.update`` changes and ``session.created`` / ``updated`` show.

One set of fields whatever the dialect; ``apply`` reads both spellings (GA ``audio.input.*``,
``output_modalities``, ``max_output_tokens``; beta ``input_audio_format``, ``modalities``,
``voice``, ``turn_detection``, ``max_response_output_tokens``) and ``to_json`` writes the client's.
Only fields present in an update change (an explicit ``null`` turns turn detection off). Values
this server cannot honour are refused naming the field: audio other than PCM16 at 24 kHz,
noise reduction, semantic VAD, a speed other than 1.0. Tools and ``tool_choice`` are checked
(``tools.py``) and kept in realtime's shape. Transcription, whatever model it
names, is done by the served model (``transcription.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from omniwalk.config import ServerConfig
from omniwalk.serve.errors import bad_request, unsupported
from omniwalk.serve.realtime import protocol as p
from omniwalk.serve.realtime.tools import ToolChoice, check_tools, tool_choice_json, tools_json
from omniwalk.serve.realtime.vad import VADParams

PCM = {"type": "audio/pcm", "rate": 24000}
SAMPLING = tuple(p.Sampling.model_fields)


@dataclass
class TurnDetection:
    vad: VADParams
    create_response: bool = True
    interrupt_response: bool = True

    def to_json(self) -> dict:
        return {
            "type": "server_vad",
            "threshold": self.vad.threshold,
            "prefix_padding_ms": self.vad.prefix_padding_ms,
            "silence_duration_ms": self.vad.silence_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
            "idle_timeout_ms": None,
        }


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
        )
        return cls(p.new_id("sess"), model, expires_at, turn_detection=TurnDetection(vad), vad_defaults=vad)

    def updated(self, update: p.SessionFields, voices: tuple[str, ...]) -> Settings:
        """These settings with what ``update`` sets (refused: an APIError naming the field)."""
        new = dataclasses.replace(self, sampling=dict(self.sampling))
        given = update.model_fields_set
        _check_refused(update, "session")
        if "instructions" in given:
            new.instructions = update.instructions or ""
        speaks = output_speaks(update, "session")
        new.speaks = new.speaks if speaks is None else speaks
        voice = output_voice(update, voices, "session")
        new.voice = new.voice if voice is None else voice
        tokens = output_max_tokens(update)
        new.max_output_tokens = new.max_output_tokens if tokens is ... else tokens
        _check_input_format(update)
        audio_input = update.audio.input if update.audio else None
        if "turn_detection" in given or (audio_input and "turn_detection" in audio_input.model_fields_set):
            td = update.turn_detection if "turn_detection" in given else audio_input.turn_detection
            where = "session.turn_detection" if "turn_detection" in given else "session.audio.input.turn_detection"
            new.turn_detection = _turn_detection(td, new.turn_detection or TurnDetection(self.vad_defaults), where)
        new.sampling.update({k: getattr(update, k) for k in SAMPLING if k in given} | (update.model_extra or {}))
        if "tools" in given:
            new.tools = list(update.tools or [])
        if "tool_choice" in given:
            new.tool_choice = update.tool_choice or "auto"
        check_tools(new.tools, new.tool_choice, "session")
        if "input_audio_transcription" in given:
            new.transcription = update.input_audio_transcription
        elif audio_input and "transcription" in audio_input.model_fields_set:
            new.transcription = audio_input.transcription
        return new

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


def output_voice(fields: p.ResponseFields, voices: tuple[str, ...], where: str) -> str | None:
    output = fields.audio.output if fields.audio else None
    voice, param = (fields.voice, f"{where}.voice") if fields.voice is not None else (None, None)
    if output is not None:
        if output.format is not None:
            _check_pcm(output.format, f"{where}.audio.output.format")
        if output.speed not in (None, 1.0):
            raise bad_request("only speed 1.0 is served", f"{where}.audio.output.speed", "unsupported_value")
        if output.voice is not None:
            voice, param = output.voice, f"{where}.audio.output.voice"
    if fields.output_audio_format not in (None, "pcm16"):
        raise _bad_format(fields.output_audio_format, f"{where}.output_audio_format")
    if isinstance(voice, dict):
        raise bad_request("custom voices are not served; name one", param, "unsupported_value")
    if voice is not None and voice.lower() not in voices:
        raise bad_request(f"unknown voice {voice!r}; available: {', '.join(voices)}", param)
    return voice.lower() if voice is not None else None


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


def _check_refused(update: p.SessionFields, where: str) -> None:
    check_response_refused(update, where)
    audio_input = update.audio.input if update.audio else None
    for name, value in (
        ("input_audio_noise_reduction", update.input_audio_noise_reduction),
        ("audio.input.noise_reduction", audio_input and audio_input.noise_reduction),
        ("prompt", update.prompt),
    ):
        if value:
            raise unsupported(f"{where}.{name}", name.rsplit(".", 1)[-1].replace("_", " "))
    if update.speed not in (None, 1.0):
        raise bad_request("only speed 1.0 is served", f"{where}.speed", "unsupported_value")


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


def _turn_detection(td: p.TurnDetection | None, base: TurnDetection, where: str) -> TurnDetection | None:
    if td is None:
        return None
    if td.type != "server_vad":
        raise bad_request(
            f"turn detection {td.type!r} is not served; use 'server_vad'", f"{where}.type", "unsupported_value"
        )
    if td.idle_timeout_ms is not None:
        raise unsupported(f"{where}.idle_timeout_ms", "idle_timeout_ms")
    vad = dataclasses.replace(
        base.vad,
        **{
            k: v
            for k, v in (
                ("threshold", td.threshold),
                ("prefix_padding_ms", td.prefix_padding_ms),
                ("silence_ms", td.silence_duration_ms),
            )
            if v is not None
        },
    )
    return TurnDetection(
        vad,
        base.create_response if td.create_response is None else td.create_response,
        base.interrupt_response if td.interrupt_response is None else td.interrupt_response,
    )
