"""``PatchSpec``: how a vision encoder cuts and bounds its frames (patch geometry + pixel budget).

A module of its own, free of torch: ``ModelInfo`` carries a family's specs (``models/family.py``),
so the server can resize media as the family's processor will, and it is imported by
``omniwalk --help``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PatchSpec:
    """Processor settings: patch geometry plus the pixel budget of one (resized) frame."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 3136
    max_pixels: int = 12845056
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this (one merged token covers factor x factor pixels)."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, fields: dict) -> PatchSpec:
        """``dataclasses.asdict(spec)`` after a trip that made its tuples lists (JSON, msgpack)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
