"""One registry per op: the name a config gives -> the implementation, and where it runs.

Each fast-path knob of ``ModelConfig`` names one registry (``REGISTRIES``, keyed by the knob). An
entry (``Impl``) says what it needs (CUDA, a 16-bit dtype, a package) through ``runs``, and where
its implementation lives (``"module:attribute"``, imported on first ``load``: the Triton kernels'
modules import Triton, which a CPU install may lack). The first entry of a registry is the
reference (PyTorch; runs everywhere; the tests' oracle). ``resolve`` turns "auto" into the first
entry of the registry's preference order that runs on the device: done once, by
``config.resolve_auto``, before the frozen config is built; the engine and the models then load
implementations by the resolved names.

    knob               op                                           entries
    attention_backend  encoders' and prefill attention (varlen)     reference, masked, torch_varlen
    decode_attention   paged decode attention                       reference, triton
    moe_backend        mixture of experts                           reference, fused
    decoder_kernels    decoder kernels: fused add + RMSNorm,        reference, fused
                       merged q/k/v and gate/up skinny GEMMs,
                       q/k norm + rope + KV store, ... (applied
                       to a component once its weights are loaded)
    lora_backend       LoRA adapters' delta after a projection      reference, triton
    persistent_decode  a small batch's decode step in one launch    reference (layer by layer), triton,
                       (the code predictor's frame: its passes,     cuda
                       ``kernels/persistent.py``, ``cuda_frame.py``)

This module imports neither torch nor Triton (``omniwalk --help`` reads the choices).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from omniwalk.errors import ConfigError

AUTO = "auto"


@dataclass(frozen=True)
class Impl:
    """A registry entry: ``name`` (the config's value), ``target`` (``"module:attribute"``) and
    what it needs to run."""

    name: str
    target: str
    cuda: bool = False  # runs on CUDA only
    half: bool = False  # needs a 16-bit dtype
    package: str | None = None  # needs this package installed

    def runs(self, device: str, dtype: str) -> bool:
        """Whether this entry runs on ``device`` (a torch device string: "cpu", "cuda:1") with
        ``dtype`` (a ``ModelConfig.dtype`` name)."""
        on_cuda = device.split(":")[0] == "cuda"
        return (
            (on_cuda or not self.cuda)
            and (dtype != "float32" or not self.half)
            and (self.package is None or importlib.util.find_spec(self.package) is not None)
        )

    def load(self) -> Any:
        return _load(self.target)


@functools.cache
def _load(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


class Registry:
    """The entries of one op. ``prefer``: the names "auto" tries, in order (the reference last,
    always: it runs everywhere); an entry not in it is chosen only by name."""

    def __init__(self, op: str, knob: str, entries: tuple[Impl, ...], prefer: tuple[str, ...]):
        self.op, self.knob = op, knob
        self.entries = {impl.name: impl for impl in entries}
        self.reference = entries[0].name
        if prefer[-1] != self.reference or not set(prefer) <= set(self.entries):
            raise ValueError(f"{op}: 'auto' must try entries of the registry and end at the reference")
        self.prefer = prefer

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def choices(self) -> tuple[str, ...]:
        """What the config accepts: every entry's name and "auto"."""
        return (*self.entries, AUTO)

    def get(self, name: str) -> Impl:
        try:
            return self.entries[name]
        except KeyError:
            raise ConfigError(f"{self.knob} must be one of {list(self.choices())}, got {name!r}") from None

    def load(self, name: str) -> Any:
        """The implementation of entry ``name`` (imported on first use)."""
        return self.get(name).load()

    def resolve(self, choice: str, device: str, dtype: str) -> str:
        """``choice`` with "auto" made: the first of ``prefer`` that runs on ``device`` / ``dtype``."""
        if choice != AUTO:
            return self.get(choice).name
        return next(name for name in self.prefer if self.entries[name].runs(device, dtype))


ATTENTION = Registry(
    "varlen attention",
    "attention_backend",
    (
        Impl("reference", "omniwalk.layers.attention:reference_attention"),
        Impl("masked", "omniwalk.layers.attention:masked_attention"),
        Impl("torch_varlen", "omniwalk.layers.attention:torch_varlen_attention", cuda=True, half=True),
    ),
    prefer=("torch_varlen", "reference"),  # (masked: one SDPA call, O(tokens^2): by name only)
)
DECODE_ATTENTION = Registry(
    "paged decode attention",
    "decode_attention",
    (
        Impl("reference", "omniwalk.layers.kv_attention:paged_decode_reference"),
        Impl("triton", "omniwalk.kernels.paged_decode:paged_decode_triton", cuda=True, package="triton"),
    ),
    prefer=("triton", "reference"),
)
MOE = Registry(
    "mixture of experts",
    "moe_backend",
    (
        Impl("reference", "omniwalk.layers.moe:REFERENCE_MOE"),
        Impl("fused", "omniwalk.kernels.fused_moe:FUSED_MOE", cuda=True, package="triton"),
    ),
    prefer=("fused", "reference"),
)
DECODER_KERNELS = Registry(
    "decoder kernels",
    "decoder_kernels",
    (
        Impl("reference", "omniwalk.layers.decoder:keep_reference_kernels"),
        Impl("fused", "omniwalk.layers.decoder:use_fused_kernels", cuda=True, package="triton"),
    ),
    prefer=("fused", "reference"),
)
LORA = Registry(
    "LoRA adapters' delta",
    "lora_backend",
    (
        Impl("reference", "omniwalk.lora.ops:add_lora_reference"),
        Impl("triton", "omniwalk.kernels.lora:add_lora_triton", cuda=True, package="triton"),
    ),
    prefer=("triton", "reference"),
)

PERSISTENT_DECODE = Registry(
    "persistent decode step",
    "persistent_decode",
    (
        Impl("reference", "omniwalk.layers.decoder:keep_layered_steps"),
        Impl("triton", "omniwalk.layers.decoder:use_persistent_kernels", cuda=True, package="triton"),
        Impl("cuda", "omniwalk.layers.decoder:use_persistent_cuda_kernels", cuda=True, half=True),
    ),
    prefer=("reference",),  # (triton by name only until it is measured faster on a GPU: docs/performance.md)
)

# the config knob each registry answers (``ModelConfig`` has one field per key)
REGISTRIES: dict[str, Registry] = {
    r.knob: r for r in (MOE, ATTENTION, DECODE_ATTENTION, DECODER_KERNELS, LORA, PERSISTENT_DECODE)
}
