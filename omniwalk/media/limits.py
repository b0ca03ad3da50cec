"""Bounds on what a request may bring; every decoder checks them before doing expensive work."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MediaLimits:
    """Limits on decoded media. Checked as early as the container metadata allows."""

    max_input_bytes: int = 64 * 1024 * 1024  # encoded size of one media item
    max_audio_seconds: float = 600.0
    min_audio_seconds: float = 0.05  # shorter clips give < 5 mel frames (log-mel needs > 200 samples)
    min_image_side: int = 2  # pixels; a 1x1 image carries nothing
    max_image_pixels: int = 50_000_000  # decoded, before resizing (decompression-bomb guard)
    max_aspect_ratio: float = 200.0  # the processor's smart_resize rejects more
    max_video_seconds: float = 600.0
    max_video_pixels: int = 8_294_400  # one decoded frame (3840x2160)
    video_fps: float = 2.0  # frames sampled per second of video
    min_frames: int = 4
    max_frames: int = 768
    max_video_decoded_frames: int = 100_000  # frames the demuxer may walk through
    # Decoded-size budgets in bytes, computed from the container's header before decoding (budget.py
    # says how each kind counts): what a small file may expand to in memory and decoding work.
    max_audio_decoded_bytes: int = 256 * 2**20  # float32 samples x channels: 600 s of 48 kHz stereo fits
    max_image_decoded_bytes: int = 64 * 2**20  # width x height x 3: ~22 M pixels
    max_video_decoded_bytes: int = 256 * 2**20  # sampled frames x pixels x 3 after the family's resize
    max_request_decoded_bytes: int = 512 * 2**20  # all of one request's media items together
    # Where media may come from besides inline base64 / data: URLs. Both are off by default.
    allow_remote_urls: bool = False  # http(s) URLs, fetched within fetch_timeout_s and max_input_bytes
    local_media_dir: str | None = None  # file paths / file:// URLs inside this directory only
    fetch_timeout_s: float = 10.0
    # Remote hosts must resolve to public addresses; these networks (CIDR, e.g. "10.1.0.0/16") are
    # allowed besides (loopback, link-local and private ranges are refused otherwise).
    fetch_allow_networks: tuple[str, ...] = ()

    def __post_init__(self):
        import ipaddress

        from omniwalk.errors import ConfigError

        for name in ("max_audio_decoded_bytes", "max_image_decoded_bytes", "max_video_decoded_bytes"):
            if getattr(self, name) < 1 or getattr(self, name) > self.max_request_decoded_bytes:
                raise ConfigError(f"{name} must be at least 1 and at most max_request_decoded_bytes")
        networks = self.fetch_allow_networks
        networks = networks.split(",") if isinstance(networks, str) else networks  # (a CLI value)
        object.__setattr__(self, "fetch_allow_networks", tuple(n.strip() for n in networks if n.strip()))
        for network in self.fetch_allow_networks:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ConfigError(f"fetch_allow_networks: {network!r} is not a CIDR network") from None


DEFAULT_LIMITS = MediaLimits()
