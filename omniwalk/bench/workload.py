"""What a benchmark cell asks for: paths (input to output: s speech, i image, t text, j JSON), the
work per request, and synthetic inputs.

Work is fixed where it can be, so systems are compared on equal work: the model ignores EOS and
generates exactly ``text_tokens``; speech paths generate exactly ``audio_frames`` codec frames
(``PRESETS`` count 12.5 per second; ``presets_for`` counts them in a served model's own codec
frames, so every family speaks the same seconds). The presets' sizes (4 s clips, 640x480 images,
16-160 tokens) are the matched work of the published serving comparisons whose figures a family
ships as anchors (``registry.bench_anchors``).

JSON out (``t2j``) cannot be fixed work: each request carries a ``json_schema`` response format
(round-robin over ``schemas.SCHEMAS``), and a constrained answer ends when its document is
complete: EOS is then the grammar's only allowed token, so it cannot be ignored. ``text_tokens``
is only the cap there, each request's length is recorded, and each answer is checked against its
schema (``is_valid_json``).
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, replace

import numpy as np

from omniwalk.bench.schemas import SCHEMAS

try:
    import jsonschema
except ImportError:  # (a test dependency, not a runtime one)
    jsonschema = None

VALIDATOR = "jsonschema" if jsonschema else "json.loads"  # what JSON answers are checked with


@dataclass(frozen=True)
class Workload:
    path: str  # s2t, i2t, s2s, i2s, t2t, t2s, t2j
    text_tokens: int  # with fixed work, exactly this many; otherwise the cap (max_tokens)
    audio_seconds: float = 4.0  # input speech (s2*)
    image_size: tuple[int, int] = (640, 480)  # input image width x height (i2*)
    audio_frames: int = 0  # output speech frames (*2s)
    is_fixed_work: bool = True  # False: the answer ends where the model (or its grammar) ends it

    @property
    def speaks(self) -> bool:
        return self.path.endswith("2s")

    @property
    def writes_json(self) -> bool:
        return self.path.endswith("2j")

    def is_valid_answer(self, text: str, seed: int) -> bool | None:
        """Whether request ``seed``'s answer is valid (JSON out: it parses and validates against the
        request's schema); None where a path has no notion of a valid answer."""
        return is_valid_json(text, schema_of(seed)[1]) if self.writes_json else None


PRESETS = {
    "s2t": Workload("s2t", text_tokens=16),
    "i2t": Workload("i2t", text_tokens=160),
    "s2s": Workload("s2s", text_tokens=40, audio_frames=50),  # 4 s of speech
    "i2s": Workload("i2s", text_tokens=40, audio_frames=125),  # 10 s of speech
    "t2t": Workload("t2t", text_tokens=128),
    "t2s": Workload("t2s", text_tokens=40, audio_frames=50),
    "t2j": Workload("t2j", text_tokens=400, is_fixed_work=False),  # (every corpus document fits in 400)
}


def presets_for(model: str) -> dict[str, Workload]:
    """``PRESETS`` with speech out in the served ``model``'s codec frames (the same seconds of speech;
    the rate is its family's, ``registry.codec_frames_per_second``)."""
    from omniwalk.models.registry import codec_frames_per_second

    rate = codec_frames_per_second(model)
    return {name: replace(w, audio_frames=round(w.audio_frames * rate / 12.5)) for name, w in PRESETS.items()}


def speech_like(seconds: float, seed: int, rate: int = 16000) -> np.ndarray:
    """A voiced-speech stand-in: a 100-250 Hz glottal pulse train through moving formants,
    syllable-rate amplitude modulation and a little noise (float32 in [-1, 1])."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = 100 + 150 * rng.random() + 20 * np.sin(2 * np.pi * 0.5 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    source = sum(np.sin(k * phase) / k for k in range(1, 20))
    formants = sum(np.sin(2 * np.pi * f * t) for f in (500 + 300 * np.sin(2 * np.pi * 1.3 * t), 1500, 2500))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t + rng.random() * 6) ** 2
    wave = source * (1 + 0.3 * formants) * envelope + 0.02 * rng.standard_normal(t.shape)
    return (0.3 * wave / np.abs(wave).max()).astype(np.float32)


def photo_like(width: int, height: int, seed: int) -> np.ndarray:
    """Smooth colour gradients with blobs and fine texture (uint8 H x W x 3), JPEG-friendly."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    image = np.zeros((height, width, 3))
    for c in range(3):
        image[..., c] = 0.5 + 0.25 * np.sin(2 * np.pi * (rng.random() * 3 * x + rng.random() * 3 * y))
        for _ in range(6):
            cx, cy, r = rng.random(), rng.random() * height / width, 0.05 + 0.15 * rng.random()
            image[..., c] += 0.3 * (rng.random() - 0.5) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / r**2)
    image += 0.03 * rng.standard_normal(image.shape)
    return (np.clip(image, 0, 1) * 255).astype(np.uint8)


def schema_of(seed: int) -> tuple[str, dict]:
    """(name, JSON Schema) of request ``seed`` on a JSON path: round-robin over the corpus."""
    name = list(SCHEMAS)[seed % len(SCHEMAS)]
    return name, SCHEMAS[name]


def is_valid_json(text: str, schema: dict) -> bool:
    """Whether ``text`` parses as JSON that validates against ``schema`` (parses, only, where the
    ``jsonschema`` package is not installed: see ``VALIDATOR``)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return False
    return jsonschema is None or jsonschema.validators.validator_for(schema)(schema).is_valid(document)


def request_body(work: Workload, model: str, seed: int) -> dict:
    """One OpenAI chat request with this workload's inputs and output length (exact with fixed work,
    a cap otherwise) and, on a JSON path, request ``seed``'s schema as a strict ``json_schema``."""
    ask = "Please answer in JSON." if work.writes_json else "Please answer in detail."
    content: list[dict] = [{"type": "text", "text": ask}]
    if work.path.startswith("s"):
        buf = io.BytesIO()
        import soundfile

        soundfile.write(buf, speech_like(work.audio_seconds, seed), 16000, format="WAV", subtype="PCM_16")
        data = base64.b64encode(buf.getvalue()).decode()
        content.insert(0, {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}})
    if work.path.startswith("i"):
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(photo_like(*work.image_size, seed)).save(buf, format="JPEG", quality=90)
        url = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
        content.insert(0, {"type": "image_url", "image_url": {"url": url}})
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": work.text_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if work.is_fixed_work:
        body.update(min_tokens=work.text_tokens, ignore_eos=True)
    if work.writes_json:
        name, schema = schema_of(seed)
        json_schema = {"name": name, "schema": schema, "strict": True}
        body["response_format"] = {"type": "json_schema", "json_schema": json_schema}
    if work.speaks:
        body.update(
            modalities=["text", "audio"],
            audio={"voice": "ethan", "format": "pcm16"},
            min_audio_frames=work.audio_frames,
            max_audio_frames=work.audio_frames,
        )
    return body
