"""Video bytes (mp4, webm, ... via PyAV) or frame arrays -> sampled uint8 frames + audio track.

Frames are sampled uniformly at ``limits.video_fps`` (default 2 per second), the count bounded
to [min_frames, max_frames] and the video's own frame count and rounded down to an even number
(two frames form one temporal patch), as qwen-omni-utils samples them. ``sampled_fps`` is the
rate actually kept; ``patches.seconds_per_grid(sampled_fps)`` is the MRoPE time step.

Given the family's ``PatchSpec``, each kept frame is resized as it is decoded (one full-size
frame at a time, never a stack of them), and the sampled frames' size after that resize is
checked against ``max_video_decoded_bytes`` before any frame is decoded (``budget.py``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from omniwalk.errors import MediaError
from omniwalk.media.audio import decode_audio_stream
from omniwalk.media.budget import DecodeTicket, admit
from omniwalk.media.errors import CorruptMediaError, EmptyMediaError, MediaLimitError
from omniwalk.media.image import check_frame_size
from omniwalk.media.limits import DEFAULT_LIMITS, MediaLimits
from omniwalk.media.patch_spec import PatchSpec

FRAME_FACTOR = 2  # temporal_patch_size: sampled frame counts are multiples of it


@dataclass
class DecodedVideo:
    frames: np.ndarray  # uint8 [T, H, W, 3]
    sampled_fps: float  # frames kept per second of video
    audio: np.ndarray | None  # mono float32 at 16 kHz, None when the video has no audio track


def sample_frame_indices(total_frames: int, source_fps: float, limits: MediaLimits) -> np.ndarray:
    """Indices of the frames to keep out of ``total_frames`` decoded at ``source_fps``."""
    if total_frames < 1:
        raise EmptyMediaError("video has no frames")
    wanted = total_frames / source_fps * limits.video_fps
    upper = min(limits.max_frames, total_frames) // FRAME_FACTOR * FRAME_FACTOR
    count = int(min(max(wanted, limits.min_frames), upper) // FRAME_FACTOR * FRAME_FACTOR)
    count = max(count, min(total_frames, FRAME_FACTOR))  # a 1-frame video keeps its frame
    return np.linspace(0, total_frames - 1, count).round().astype(np.int64)


def decode_video(
    data: bytes | np.ndarray,
    limits: MediaLimits = DEFAULT_LIMITS,
    *,
    fps: float | None = None,
    spec: PatchSpec | None = None,
    ticket: DecodeTicket | None = None,
) -> DecodedVideo:
    """Encoded bytes, or uint8 frames [T, H, W, 3] at ``fps`` (required then), -> sampled frames,
    resized by ``spec`` (its smart_resize size; None: as decoded)."""
    if isinstance(data, np.ndarray):
        video = _from_array(data, limits, fps)
        if spec is not None:
            import torch

            from omniwalk.media.patches import resize_video

            resized = resize_video(torch.from_numpy(video.frames), spec)
            video.frames = resized.permute(0, 2, 3, 1).contiguous().numpy()
        return video
    if len(data) > limits.max_input_bytes:
        raise MediaLimitError(f"video is {len(data)} bytes; the limit is {limits.max_input_bytes}")
    import av  # (lazy: PyAV is large, and only encoded video and rare audio formats need it)

    data = bytes(data)
    try:
        frames, sampled_fps = _decode_frames(data, limits, spec, ticket)
    except MediaError:
        raise
    except (av.FFmpegError, ValueError, IndexError, ZeroDivisionError):
        raise CorruptMediaError("could not decode video (corrupt data or an unsupported codec)") from None
    return DecodedVideo(frames, sampled_fps, decode_audio_stream(data, limits, ticket))


def _from_array(frames: np.ndarray, limits: MediaLimits, fps: float | None) -> DecodedVideo:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise CorruptMediaError(f"video array must be uint8 [T, H, W, 3], got {frames.dtype} {frames.shape}")
    if not fps or fps <= 0:
        raise CorruptMediaError("a video given as frames needs its frame rate (fps > 0)")
    check_frame_size(frames.shape[1], frames.shape[2], limits, limits.max_video_pixels)
    _check_duration(frames.shape[0] / fps, limits)
    idx = sample_frame_indices(frames.shape[0], fps, limits)
    return DecodedVideo(np.ascontiguousarray(frames[idx]), len(idx) / frames.shape[0] * fps, None)


def _check_duration(seconds: float, limits: MediaLimits) -> None:
    if seconds > limits.max_video_seconds:
        raise MediaLimitError(f"video is {seconds:.1f} s long; the limit is {limits.max_video_seconds} s")


def _decode_frames(
    data: bytes, limits: MediaLimits, spec: PatchSpec | None, ticket: DecodeTicket | None
) -> tuple[np.ndarray, float]:
    import av

    with av.open(io.BytesIO(data)) as container:
        if not container.streams.video:
            raise EmptyMediaError("no video stream found")
        stream = container.streams.video[0]
        height, width = stream.codec_context.height, stream.codec_context.width
        check_frame_size(height, width, limits, limits.max_video_pixels)
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        if fps <= 0:
            raise CorruptMediaError("video has no frame rate")
        seconds = float(stream.duration * stream.time_base) if stream.duration else (container.duration or 0) / 1e6
        _check_duration(seconds, limits)
        total = stream.frames or round(seconds * fps)
        if total > limits.max_video_decoded_frames:
            raise MediaLimitError(f"video has {total} frames; the limit is {limits.max_video_decoded_frames}")
        keep = sample_frame_indices(total, fps, limits)
        size = (height, width) if spec is None else _smart_resize(height, width, spec)
        admit(len(keep) * size[0] * size[1] * 3, limits, "video", ticket)
        frames = _read_frames(container, stream, keep, size, ticket)
    if not len(frames):
        raise EmptyMediaError("video has no decodable frames")
    return frames, len(keep) / total * fps


def _read_frames(container, stream, keep: np.ndarray, size: tuple[int, int], ticket: DecodeTicket | None) -> np.ndarray:
    """Decode in order, converting (and resizing to ``size``) only the kept frames, one at a time;
    metadata may overstate the count. The ticket is checked at every decoded frame."""
    out = np.empty((len(keep), *size, 3), np.uint8)  # the budget admitted exactly this
    num_kept, wanted, last = 0, set(keep.tolist()), int(keep[-1])
    max_pixels = stream.codec_context.height * stream.codec_context.width
    for i, frame in enumerate(container.decode(stream)):
        if ticket is not None:
            ticket.check()
        if i in wanted:
            if frame.height * frame.width > max_pixels:
                raise CorruptMediaError("video frames grow past the size in the stream's header")
            rgb = _fit(frame.to_ndarray(format="rgb24"), size)
            for _ in range(int((keep == i).sum())):  # a repeated index (short videos) keeps the frame twice
                out[num_kept], num_kept = rgb, num_kept + 1
        if i >= last:
            break
    return out[:num_kept]


def _smart_resize(height: int, width: int, spec: PatchSpec) -> tuple[int, int]:
    from omniwalk.media.patches import smart_resize  # (lazy: torch)

    return smart_resize(height, width, spec)


def _fit(rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 [H, W, 3] -> [*size, 3] with the video resize (``resize.torch_bicubic``), frame by frame."""
    if rgb.shape[:2] == size:
        return rgb
    import torch

    from omniwalk.media.resize import torch_bicubic

    return torch_bicubic(torch.from_numpy(rgb).permute(2, 0, 1)[None], *size)[0].permute(1, 2, 0).numpy()
