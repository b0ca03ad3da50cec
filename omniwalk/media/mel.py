"""Whisper-style log-mel features in torch, on whatever device the waveforms live on.

Matches HF's ``WhisperFeatureExtractor`` as the omni processors call it (128 mels, 16 kHz,
n_fft 400, hop 160, ``padding=True``, ``truncation=False``, no dither):

    frames   stft(center, reflect) has 1 + L // 160 frames; the last is dropped -> L // 160
    power    |X|^2 -> slaney mel (0..8 kHz) -> log10(clamp 1e-10)
    range    max(log, max_over_clip(log) - 8); (log + 4) / 4

Two batching semantics (``pad_together``):

- False (serving): every clip is featurised exactly as if it were alone; it has ``L // 160``
  valid frames, the count the prompt processor uses for the audio token count.
- True (an HF processor call with several clips): clips are zero-padded to the longest first,
  so a shorter clip's last frames see zeros instead of its reflection, its range max covers the
  padded frames too, and it has ``ceil(l / 160)`` valid frames (the longest keeps ``L // 160``).

``zero_tail`` (serving, each clip alone): the clip as an extractor that pads every clip with zeros
to a fixed length (e.g. 300 s) sees it: its last frames see zeros,
its range max covers the frames that overlap the clip, and it has ``ceil(L / 160)`` valid frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F

from omniwalk.device import to_device

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
NUM_MEL_BINS = 128


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz (3 mel / 200 Hz), logarithmic above."""
    mel = 3.0 * hz / 200.0
    log = hz >= 1000.0
    mel[log] = 15.0 + np.log(hz[log] / 1000.0) * (27.0 / np.log(6.4))
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = 200.0 * mel / 3.0
    log = mel >= 15.0
    hz[log] = 1000.0 * np.exp((mel[log] - 15.0) * (np.log(6.4) / 27.0))
    return hz


@cache
def mel_filter_bank(num_mels: int = NUM_MEL_BINS, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """[n_fft // 2 + 1, num_mels] triangular slaney filters, area-normalised, computed in float64."""
    fft_hz = np.linspace(0, sample_rate // 2, n_fft // 2 + 1)
    edges_hz = _mel_to_hz(np.linspace(_hz_to_mel(np.array([0.0]))[0], _hz_to_mel(np.array([8000.0]))[0], num_mels + 2))
    widths = np.diff(edges_hz)
    # rising edge of filter m spans edges[m]..edges[m+1], falling edge edges[m+1]..edges[m+2]
    offsets = edges_hz[None, :] - fft_hz[:, None]
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    return filters * (2.0 / (edges_hz[2:] - edges_hz[:-2]))[None, :]


ZERO_TAIL = 2 * N_FFT  # zeros after a ``zero_tail`` clip: every frame that overlaps it sees them, none reflects


def num_mel_frames(num_samples: int, zero_tail: bool = False) -> int:
    """Valid mel frames of a clip featurised alone (``log_mel``'s ``zero_tail``: followed by zeros)."""
    return -(-num_samples // HOP_LENGTH) if zero_tail else num_samples // HOP_LENGTH


def _framed_batch(waves: Sequence[torch.Tensor], pad_together: bool) -> torch.Tensor:
    """[B, L_max + n_fft] signals whose stft(center=False) equals the extractor's stft(center=True)."""
    half = N_FFT // 2
    longest = max(w.shape[0] for w in waves)
    if pad_together:
        batch = torch.stack([F.pad(w, (0, longest - w.shape[0])) for w in waves])
        return F.pad(batch[:, None], (half, half), mode="reflect")[:, 0]
    # NOTE: reflect-pad each clip on its own, then zero-fill to the common length; the frames
    # past a clip's own L // 160 are computed but are not valid.
    padded = [F.pad(w[None, None], (half, half), mode="reflect")[0, 0] for w in waves]
    return torch.stack([F.pad(p, (0, longest + 2 * half - p.shape[0])) for p in padded])


@cache
def _stft_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The Hann window and the mel filter bank on ``device``, made once (not copied there per call); plain
    tensors even when first asked for under inference mode."""
    with torch.inference_mode(False):
        return torch.hann_window(N_FFT, device=device), torch.from_numpy(mel_filter_bank()).to(device, torch.float32)


def log_mel(
    waves: Sequence[torch.Tensor], *, pad_together: bool = False, zero_tail: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-mel features of mono 16 kHz float32 clips (each [L_i], L_i > 200 samples).

    Returns ``features`` [B, 128, T] float32 and ``num_frames`` [B] int64 (valid frames per clip,
    on the same device). Frames past ``num_frames`` are padding.
    """
    if not waves:
        raise ValueError("log_mel needs at least one clip")
    if pad_together and zero_tail:
        raise ValueError("zero_tail featurises each clip alone; pad_together pads them together")
    device = waves[0].device
    num_valid = [num_mel_frames(w.shape[0], zero_tail) for w in waves]
    if zero_tail:
        waves = [F.pad(w, (0, ZERO_TAIL)) for w in waves]
    lengths = to_device([w.shape[0] for w in waves], device, torch.long)
    signal = _framed_batch([w.float() for w in waves], pad_together)
    window, filters = _stft_tables(device)
    stft = torch.stft(signal, N_FFT, HOP_LENGTH, window=window, center=False, return_complex=True)
    power = stft[..., :-1].abs().pow(2)  # [B, 201, T]; drop the frame the extractor drops
    log = (filters.T @ power).clamp(min=1e-10).log10()  # [B, 128, T]
    num_total = log.shape[-1]
    if pad_together:
        num_frames = (-(-lengths // HOP_LENGTH)).clamp(max=num_total)
        peak = log.amax(dim=(1, 2), keepdim=True)
    else:
        num_frames = lengths // HOP_LENGTH
        valid = torch.arange(num_total, device=device)[None, None, :] < num_frames[:, None, None]
        peak = log.masked_fill(~valid, float("-inf")).amax(dim=(1, 2), keepdim=True)
    log = torch.maximum(log, peak - 8.0)
    return (log + 4.0) / 4.0, to_device(num_valid, device, torch.long) if zero_tail else num_frames
