"""A random HF Code2Wav made audio-like (amplitudes O(1), peak 0.9 without clipping), so waveform
comparisons see the whole signal."""

import torch


def _scale_conv(conv, factor: float) -> None:
    conv.weight.mul_(factor)
    conv.bias.mul_(factor)


@torch.no_grad()
def make_audio_like_(code2wav, codes: torch.Tensor) -> None:
    """Make a random HF code2wav audio-like, in place; ``codes`` [B, Q, F] calibrate it.

    HF's random init grows the decoder's intermediate amplitudes to ~40 and clips ~90% of the
    output, which hides most of the waveform from a comparison and amplifies fp32 rounding
    ~1000x. Halving the decoder conv weights keeps amplitudes O(1); the last conv (linear in its
    weight and bias together) is then scaled so the waveform peaks at 0.9 without clipping.
    """
    for m in code2wav.decoder.modules():
        if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            _scale_conv(m, 0.5)
    _scale_conv(code2wav.decoder[-1].conv, 1e-3)
    peak = code2wav(codes).abs().max().item()
    assert peak < 0.9, "calibration run clipped"
    _scale_conv(code2wav.decoder[-1].conv, 0.9 / peak)
