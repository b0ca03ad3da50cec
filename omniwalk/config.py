"""Engine and model knobs as frozen dataclasses: one source of truth, no environment variables.

``OmniConfig`` is what ``Omni`` (and later the server) is built from; the server extends it with
its own fields. Values are validated here, once, with errors that name the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from omniwalk.errors import ConfigError

DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory and "
    "visual inputs, as well as generating text and speech."
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    model: str  # checkpoint directory (config.json, safetensors, tokenizer.json, chat template)
    device: str = "cpu"
    dtype: str = "float32"
    max_model_len: int | None = None  # prompt + generated tokens; None = the checkpoint's max positions
    default_system_prompt: str | None = DEFAULT_SYSTEM_PROMPT  # used when a request has no system turn
    moe_backend: str = "reference"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        try:
            torch.device(self.device)
        except RuntimeError:
            raise ConfigError(f"device {self.device!r} is not a torch device") from None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class OmniConfig:
    model: ModelConfig = field(default_factory=lambda: ModelConfig(model=""))

    @classmethod
    def from_kwargs(cls, **kwargs) -> OmniConfig:
        """Keyword arguments named after ``ModelConfig`` fields -> the config; unknown names are errors."""
        known = {f.name for f in fields(ModelConfig)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown}; known: {sorted(known)}")
        return cls(model=ModelConfig(**kwargs))
