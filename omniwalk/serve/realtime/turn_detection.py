"""A session's turn detection: what ``turn_detection`` sets, served by the server VAD (``vad.py``).

Two types are accepted, both served by the same VAD:

- ``server_vad``: ``threshold``, ``prefix_padding_ms`` and ``silence_duration_ms`` set the VAD.
- ``semantic_vad``: OpenAI's detector reads the words to decide whether a turn is over; here
  ``eagerness`` picks the silence that ends a turn instead (an approximation: the words are not
  read), threshold and padding are the server's defaults:

      eagerness        low     medium, auto    high
      silence (ms)     1000    500             250

``create_response`` and ``interrupt_response`` act the same for both, and so does omniwalk's
``preemptive_silence_ms`` (the quiet after which the answer is prepared unsent, ``session.py``;
0 or ``null``: no preemption; default ``ServerConfig.realtime_preemptive_silence_ms``).
``session.created`` / ``updated`` show the type the client set with its own fields
(``semantic_vad`` with its ``eagerness``). ``null`` turns detection off.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from omniwalk.serve.errors import bad_request, unsupported
from omniwalk.serve.realtime import protocol as p
from omniwalk.serve.realtime.vad import VADParams

EAGERNESS_SILENCE_MS = {"low": 1000, "medium": 500, "auto": 500, "high": 250}
_SERVER_VAD_ONLY = ("threshold", "prefix_padding_ms", "silence_duration_ms")


@dataclass
class TurnDetection:
    vad: VADParams
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str | None = None  # set: the client asked for semantic_vad

    def to_json(self) -> dict:
        common = {
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
            "preemptive_silence_ms": self.vad.tentative_ms or 0,
        }
        if self.eagerness is not None:
            return {"type": "semantic_vad", "eagerness": self.eagerness, **common}
        return {
            "type": "server_vad",
            "threshold": self.vad.threshold,
            "prefix_padding_ms": self.vad.prefix_padding_ms,
            "silence_duration_ms": self.vad.silence_ms,
            **common,
            "idle_timeout_ms": None,
        }


def turn_detection(
    td: p.TurnDetection | None, current: TurnDetection | None, defaults: VADParams, where: str
) -> TurnDetection | None:
    """What a ``turn_detection`` field sets, over the ``current`` one (None: off); 400 naming the field."""
    if td is None:
        return None
    if td.idle_timeout_ms is not None:
        raise unsupported(f"{where}.idle_timeout_ms", "idle_timeout_ms")
    base = current or TurnDetection(defaults)
    flags = {
        "create_response": base.create_response if td.create_response is None else td.create_response,
        "interrupt_response": base.interrupt_response if td.interrupt_response is None else td.interrupt_response,
    }
    tentative = base.vad.tentative_ms
    if "preemptive_silence_ms" in td.model_fields_set:
        tentative = td.preemptive_silence_ms or None
    if td.type == "semantic_vad":
        for name in _SERVER_VAD_ONLY:
            if getattr(td, name) is not None:
                message = f"semantic_vad has no {name} (server_vad has)"
                raise bad_request(message, f"{where}.{name}", "unknown_parameter")
        eagerness = td.eagerness or "auto"
        vad = dataclasses.replace(defaults, silence_ms=EAGERNESS_SILENCE_MS[eagerness], tentative_ms=tentative)
        return TurnDetection(vad, eagerness=eagerness, **flags)
    if td.eagerness is not None:
        raise bad_request("server_vad has no eagerness (semantic_vad has)", f"{where}.eagerness", "unknown_parameter")
    given = {"threshold": td.threshold, "prefix_padding_ms": td.prefix_padding_ms, "silence_ms": td.silence_duration_ms}
    vad = base.vad if base.eagerness is None else defaults  # (semantic_vad's silence is not server_vad's)
    vad = dataclasses.replace(vad, tentative_ms=tentative, **{k: v for k, v in given.items() if v is not None})
    return TurnDetection(vad, **flags)
