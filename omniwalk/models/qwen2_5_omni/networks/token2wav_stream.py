"""Streaming token2wav: which DiT windows to solve as codes arrive, and which vocoder spans to decode.

The scheme and its error are described in ``token2wav.py``. In mel frames, with C = ``chunk``,
P = ``back``, F = ``ahead``, V = ``vocoder_context``:

    window k        [kC - P, (k+1)C + F)  clipped to [0, frames); solved when the talker has
                                          (k+1)C + F frames (or has ended: the last window
                                          then keeps everything to the end)
    kept            [kC, (k+1)C)          final mel, appended to the stream's mel
    vocoder span    emits frames [e, f - V) once f frames are final (to f at the end; past the
                    first V frames, C a span: [e, e + C) once e + C + V are final, the regular one),
                    decoding [e - V, f) and keeping the samples of [e, f - V); the last span
                    of an utterance starts earlier, at the end less ``tail_span`` frames, when
                    the utterance is that long (more left context gives the same samples): past
                    its first two, every span of a long stream is C + 2V frames (one CUDA graph)

Window starts are multiples of the block size, so a window's attention blocks are the one-shot's.
All offsets are whole codec tokens (blocks hold whole tokens; ``dit.py`` checks it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from omniwalk.errors import ConfigError
from omniwalk.models.qwen2_5_omni.networks.token2wav import NoiseStream, Token2WavConfig

ONE_WINDOW = 2**40  # a chunk no utterance reaches: its window comes only at the end and keeps everything


@dataclass(frozen=True)
class Token2WavStreamConfig:
    chunk_blocks: int = 3  # DiT blocks a chunk emits (the reference's: 3 blocks, 72 frames, 0.72 s)
    # mel frames of context either side of a vocoder span; 0 = BigVGAN's receptive field, which
    # makes the vocoder exact (38 frames for the 7B config; the reference uses 20)
    vocoder_context_frames: int = 0


@dataclass(frozen=True)
class Window:
    """A DiT solve over mel frames [start, end) that keeps [keep_start, keep_end)."""

    start: int
    keep_start: int
    keep_end: int
    end: int

    @property
    def num_frames(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class StreamPlan:
    chunk: int
    back: int
    ahead: int
    vocoder_context: int
    repeats: int

    @classmethod
    def build(cls, cfg: Token2WavConfig, stream: Token2WavStreamConfig = Token2WavStreamConfig()) -> StreamPlan:
        if stream.chunk_blocks < 1 or stream.vocoder_context_frames < 0:
            raise ConfigError("token2wav stream: chunk_blocks must be >= 1 and vocoder_context_frames >= 0")
        block = cfg.dit.block_size
        return cls(
            chunk=stream.chunk_blocks * block,
            back=len(cfg.dit.look_backward_layers) * block,
            ahead=len(cfg.dit.look_ahead_layers) * block,
            vocoder_context=stream.vocoder_context_frames or cfg.bigvgan.receptive_field_frames(),
            repeats=cfg.dit.repeats,
        )

    @property
    def tail_span(self) -> int:
        """The frames a stream's last vocoder span decodes (when the utterance has them): the regular
        span's C + 2V, since a last span emits fewer than C + V frames (``StreamState.next_span``)."""
        return self.chunk + 2 * self.vocoder_context

    def whole(self) -> StreamPlan:
        """The one-shot plan: a single window over the whole utterance once the talker has ended,
        then one vocoder span (``Token2Wav.forward``'s decode, batched as stream rows are)."""
        return dataclasses.replace(self, chunk=ONE_WINDOW)

    def window(self, k: int, num_frames: int, finished: bool) -> Window | None:
        """Chunk k's window if ``num_frames`` frames of codes allow it (None if not yet, or never).

        NOTE: whether a window is regular depends only on the frames there, never on when the
        talker's end is seen, so the windows (and the audio) are a function of the codes alone.
        """
        keep_start, keep_end = k * self.chunk, (k + 1) * self.chunk
        if keep_end + self.ahead <= num_frames:
            return Window(max(0, keep_start - self.back), keep_start, keep_end, keep_end + self.ahead)
        if finished and keep_start < num_frames:
            return Window(max(0, keep_start - self.back), keep_start, num_frames, num_frames)
        return None


@dataclass(frozen=True)
class VocoderSpan:
    """Decode final mel frames [start, end), keep the samples of frames [emit_start, emit_end)."""

    start: int
    end: int
    emit_start: int
    emit_end: int


class StreamState:
    """One utterance's streaming progress: windows started, final mel, frames vocoded."""

    def __init__(self, plan: StreamPlan, seed: int, mel_dim: int, device="cpu"):
        self.plan = plan
        self.noise = NoiseStream(seed, mel_dim)
        self.num_windows = 0  # windows started
        self.num_planned = 0  # mel frames the started windows keep
        self.num_total: int | None = None  # the utterance's mel frames, once the talker has ended
        self.mel = torch.empty(0, mel_dim, device=device)  # final mel frames [mel_offset, num_final)
        self.mel_offset = 0
        self.num_final = 0  # mel frames solved and kept
        self.num_vocoded = 0  # mel frames whose samples were decoded

    def finish(self, num_codes: int) -> None:
        """The talker has ended with ``num_codes`` codes."""
        self.num_total = num_codes * self.plan.repeats

    def next_window(self, num_codes: int) -> Window | None:
        """The next window if its codes are there; ``start`` it to take it."""
        if self.num_total is not None and self.num_planned >= self.num_total:
            return None  # (a last window keeps everything to the end)
        return self.plan.window(self.num_windows, num_codes * self.plan.repeats, self.num_total is not None)

    def start(self, window: Window) -> None:
        self.num_windows += 1
        self.num_planned = window.keep_end

    def next_span(self, num_final: int) -> VocoderSpan | None:
        """The vocoder span that ``num_final`` final frames allow (None if none); ``add`` takes it.

        With C + V final frames past the frames vocoded, a regular span: emit the next C, decode them
        with V frames of context either side (C + 2V frames once V are vocoded). A stream that falls
        behind (windows solved together) so catches up one regular span a call, each a graph's length.
        Else the last span once the utterance is complete (the tail span where it has the frames),
        else, while fewer than V frames are vocoded, what the final frames allow (the first spans)."""
        plan, done = self.plan, self.num_vocoded
        start = max(0, done - plan.vocoder_context)
        if num_final - done >= plan.chunk + plan.vocoder_context:
            return VocoderSpan(start, done + plan.chunk + plan.vocoder_context, done, done + plan.chunk)
        is_complete = num_final == self.num_total
        if not is_complete and done >= plan.vocoder_context:
            return None  # (past the first spans, only regular ones: what is left waits for the next window)
        emit_end = num_final if is_complete else num_final - plan.vocoder_context
        if emit_end <= done:
            return None
        if is_complete and num_final - start < plan.tail_span <= num_final:
            start = num_final - plan.tail_span  # (the tail span: more left context, the same samples)
        return VocoderSpan(start, num_final, done, emit_end)

    def kept_mel(self, windows: list[tuple[Window, torch.Tensor]]) -> torch.Tensor:
        """The final mel after solved windows (in order; each with its whole mel [frames, mel_dim])
        are added: [frames from ``mel_offset``, mel_dim]. Changes nothing (``add`` does)."""
        if not windows:
            return self.mel
        kept, expected = [self.mel], self.num_final
        for window, mel in windows:
            if window.keep_start != expected:
                raise RuntimeError(f"token2wav window {window} out of order (final mel ends at {expected})")
            kept.append(mel[window.keep_start - window.start : window.keep_end - window.start].to(self.mel.device))
            expected = window.keep_end
        return torch.cat(kept)

    def span_mel(self, mel: torch.Tensor, span: VocoderSpan) -> torch.Tensor:
        """A span's [mel_dim, frames] out of ``kept_mel``'s result."""
        return mel[span.start - self.mel_offset : span.end - self.mel_offset].T

    def add(self, mel: torch.Tensor, num_final: int, span: VocoderSpan | None) -> None:
        """Take ``kept_mel``'s result (final frames up to ``num_final``) and the span decoded from
        it; frames no later span reads (the tail span included) are dropped."""
        self.mel, self.num_final = mel, num_final
        if span is not None:
            self.num_vocoded = span.emit_end
        drop = max(0, self.num_vocoded - self.plan.tail_span) - self.mel_offset
        if drop > 0:
            self.mel, self.mel_offset = self.mel[drop:], self.mel_offset + drop

    @property
    def is_done(self) -> bool:
        return self.num_vocoded == self.num_total
