"""Engine program for Qwen2.5-Omni's token2wav: flow-matching steps batched across requests, streamed.

Consumes, per request, a ``Token2WavState`` (``state_of(req)``, by default ``req.state.token2wav``)
that the walk fills: the voice (a key of the checkpoint's ``spk_dict``), the noise seed, the ODE
steps, and the talker's codec ids as they come (EOS excluded) with ``finished`` once the talker
ends. Produces 24 kHz mono float32 audio chunks: ``req.emit("audio", samples)``, also kept in
``Token2WavState.chunks``.

Each request's utterance is cut into DiT windows as its codes arrive (``token2wav_stream.py``).
A window is a row: its ODE state x [frames, mel], its conditions, its time grid and the Runge-Kutta
steps it has done. Every ``run`` advances **every row of the batch by one RK step in one batched
solve** (rows padded to the longest, padding never attended; each row at its own time), so
requests join and leave between steps. A row whose last step is done hands its kept mel to its
request's stream; the vocoder then decodes the spans that became final, rows of equal span length
in one BigVGAN call. Work units are mel frames of the rows (the stage's budget caps a batch).

A request's rows and its noise depend on its codes and seed only, never on its batch-mates, so a
request's audio is the same alone or in any batch, to float rounding (the tests measure it).

Wiring: ``BatchStage("token2wav", Token2WavProgram(model, spk_dict, device), BatchStageConfig(
max_batch_units=<mel frames per batched solve>, max_batch_requests=...))``; the talker side appends
to ``codes`` and sets ``finished`` (a request that ends with no codes finishes with no audio). The
first audio needs C + F frames of codes (``token2wav_stream.py``: 48 codes, 0.96 s of speech, for
the 7B config) and the solve of their window: (num_steps - 1) stage steps.

CUDA graphs (``graph_max_batch`` > 0, captured at start-up): the batched RK step per padded length
(the stream's first window, C + F frames, and its regular one, P + C + F; a batch pads its rows
to the smaller that holds them, padding never attended) and BigVGAN per span length (the stream's
spans, its last included: ``StreamPlan.tail_span``; decoded at their exact length, no padding in time),
each per batch bucket. Longer rows (one-shot decodes, ``StreamPlan.whole``) and other spans (the ends
of utterances shorter than a regular span) run eagerly, counted in ``stats``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from omniwalk.device import HostCopy, to_device
from omniwalk.engine.batch_stage import BatchProgram
from omniwalk.engine.cuda_graphs import GraphedStep, StaticInput, batch_buckets
from omniwalk.engine.request import EngineRequest, Work
from omniwalk.errors import InvalidRequestError
from omniwalk.models.qwen2_5_omni.networks.dit import block_masks
from omniwalk.models.qwen2_5_omni.networks.token2wav import Token2Wav, ode_times, rk38_step
from omniwalk.models.qwen2_5_omni.networks.token2wav_stream import (
    StreamPlan,
    StreamState,
    Token2WavStreamConfig,
    VocoderSpan,
    Window,
)


@dataclass
class Token2WavState:
    """One request's token2wav inputs (set by the walk) and progress (kept by the program)."""

    voice: str  # a key of the checkpoint's spk_dict, any case
    seed: int  # the noise: ``initial_noise(seed, ...)`` of the whole utterance
    num_steps: int | None = None  # ODE time points; None = the checkpoint's default
    one_shot: bool = False  # one window over the whole utterance when the talker ends (``StreamPlan.whole``)
    codes: list[int] = field(default_factory=list)  # talker codec ids so far, EOS excluded
    finished: bool = False  # the talker has ended: ``codes`` is complete
    stream: StreamState | None = None
    chunks: list[torch.Tensor] = field(default_factory=list)  # PCM chunks emitted, in order
    num_emitted: int = 0  # mel frames whose samples were emitted


@dataclass
class _Row:
    """A DiT window being solved."""

    req: EngineRequest
    window: Window
    x: torch.Tensor  # [frames, mel] the ODE state
    conditions: torch.Tensor  # [2, frames, ...] (``DiT.condition_rows``)
    times: torch.Tensor  # the time grid
    step: int = 0  # RK steps done

    @property
    def is_solved(self) -> bool:
        return self.step == len(self.times) - 1


class Token2WavProgram(BatchProgram):
    def __init__(
        self,
        model: Token2Wav,
        voices: dict[str, dict[str, torch.Tensor]],
        device,
        stream: Token2WavStreamConfig | None = None,
        state_of: Callable[[EngineRequest], Token2WavState] = lambda req: req.state.token2wav,
        graph_max_batch: int = 0,
    ):
        """``voices``: the checkpoint's ``spk_dict`` (name -> {"cond", "ref_mel", ...}); CUDA graphs
        of up to ``graph_max_batch`` rows (0 = none)."""
        self.model, self.device, self.state_of = model, device, state_of
        self.graph_max_batch = graph_max_batch
        self.dit_graphs: dict[int, GraphedStep] = {}  # padded frames -> the RK step's graphs
        self.vocoder_graphs: dict[int, GraphedStep] = {}  # span frames -> BigVGAN's graphs
        self.num_eager_calls = 0  # DiT steps and vocoder calls that fit no graph while graphs are on
        self.voices = {name.lower(): entry for name, entry in voices.items()}
        self.plan = StreamPlan.build(model.cfg, stream or Token2WavStreamConfig())
        self.one_shot_plan = self.plan.whole()
        self.speaker_rows: dict[str, torch.Tensor] = {}  # voice -> ``Token2Wav.speaker_rows``, made once
        self.times: dict[int, torch.Tensor] = {}  # num_steps -> time grid
        self.rows: dict[str, list[_Row]] = defaultdict(list)  # request id -> its rows, in window order
        self.starting: dict[str, list[Window]] = {}  # windows ``take`` chose, made rows by ``run``
        self.num_rk_steps = 0  # batched RK steps run (each advances every row of its batch)

    # --- scheduling ----------------------------------------------------------------------------

    def take(self, req: EngineRequest, budget: int, batch_is_empty: bool) -> int:
        st = self.state_of(req)
        stream = self._stream(st)
        units = sum(r.window.num_frames for r in self.rows.get(req.id, ())) + sum(
            w.num_frames for w in self.starting.get(req.id, ())
        )
        while (window := stream.next_window(len(st.codes))) is not None:
            if units + window.num_frames > budget and not (batch_is_empty and units == 0):
                break
            stream.start(window)
            self.starting.setdefault(req.id, []).append(window)
            units += window.num_frames
        if not units and stream.next_span(stream.num_final) is not None:
            return 1  # only audio left to decode (the end of an utterance no window covers)
        return units

    def _stream(self, st: Token2WavState) -> StreamState:
        if st.stream is None:
            mel_dim = self.model.cfg.dit.mel_dim
            plan = self.one_shot_plan if st.one_shot else self.plan
            st.stream = StreamState(plan, st.seed, mel_dim, self.device)
        if st.finished and st.stream.num_total is None:
            st.stream.finish(len(st.codes))
        return st.stream

    def is_finished(self, req: EngineRequest) -> bool:
        st = self.state_of(req)
        return st.finished and st.stream is not None and st.num_emitted == st.stream.num_total

    def stats(self) -> dict:
        out = {"rows": sum(len(rows) for rows in self.rows.values()), "rk_steps": self.num_rk_steps}
        if self.graph_max_batch:
            graphs = (*self.dit_graphs.values(), *self.vocoder_graphs.values())
            out.update(graph_replays=sum(g.num_replays for g in graphs), eager_calls=self.num_eager_calls)
        return out

    def capture_graphs(self, pool=None):
        """The RK step's graphs per padded length and BigVGAN's per span length (module docstring)."""
        if not self.graph_max_batch:
            return pool
        dit, plan, buckets = self.model.cfg.dit, self.plan, batch_buckets(self.graph_max_batch)
        width = dit.enc_dim + dit.emb_dim + dit.enc_emb_dim
        for frames in sorted({plan.chunk + plan.ahead, plan.back + plan.chunk + plan.ahead}):
            inputs = {
                "x": StaticInput((frames, dit.mel_dim), torch.float32),
                "conditions": StaticInput((2, frames, width), torch.float32),
                "t0": StaticInput((), torch.float32),
                "t1": StaticInput((), torch.float32),
                "lengths": StaticInput((), torch.long, 1),
            }
            graph = GraphedStep(f"token2wav step {frames}", self._solve_step, inputs, buckets, self.device)
            pool, self.dit_graphs[frames] = graph.capture(pool), graph
        for frames in regular_span_lengths(plan):
            inputs = {"mel": StaticInput((dit.mel_dim, frames), torch.float32)}
            graph = GraphedStep(f"token2wav vocoder {frames}", self._vocoder, inputs, buckets, self.device)
            pool, self.vocoder_graphs[frames] = graph.capture(pool), graph
        return pool

    def release(self, req: EngineRequest) -> None:
        self.rows.pop(req.id, None)
        self.starting.pop(req.id, None)

    # --- the step --------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, batch: list[Work]) -> Callable[[], None]:
        """One RK step for every row of the batch's requests, then the vocoder spans that became
        final. Request state changes only after everything is computed (a raise leaves it as it was)."""
        rows = {
            req.id: self.rows.get(req.id, []) + [self._new_row(req, w) for w in self.starting.get(req.id, [])]
            for req, _ in batch
        }
        flat = [row for rs in rows.values() for row in rs]
        new_x = dict(zip(map(id, flat), self._rk_step(flat), strict=True)) if flat else {}
        updates = {req.id: self._stream_update(req, rows[req.id], new_x) for req, _ in batch}
        wavs = self._vocode([(req, mel, span) for req, _ in batch for mel, _, span in [updates[req.id]] if span])
        # --- commit (nothing below raises) ---
        for row in flat:
            row.x, row.step = new_x[id(row)], row.step + 1
        self.num_rk_steps += bool(flat)
        for req, _ in batch:
            self.starting.pop(req.id, None)
            self.rows[req.id] = [row for row in rows[req.id] if not row.is_solved]
            self.state_of(req).stream.add(*updates[req.id])
        copies = [(req, span, HostCopy(wav)) for (req, span), wav in wavs]

        def commit() -> None:
            for req, span, copy in copies:
                if req.status.is_done:  # aborted or failed after the launch
                    continue
                st, samples = self.state_of(req), copy.get()
                st.num_emitted = span.emit_end
                st.chunks.append(samples)
                req.emit("audio", samples)

        return commit

    def _new_row(self, req: EngineRequest, window: Window) -> _Row:
        st, cfg = self.state_of(req), self.model.cfg
        r = cfg.dit.repeats
        codes = torch.tensor(st.codes[window.start // r : window.end // r], dtype=torch.long)
        self.model.check_codes(codes)  # (on the host: no device sync)
        codes = to_device(codes, self.device)
        noise = to_device(st.stream.noise.get(window.start, window.end), self.device)
        return _Row(req, window, noise, self.model.dit.condition_rows(self._speaker(st.voice), codes), self._times(st))

    def _speaker(self, voice: str) -> torch.Tensor:
        key = voice.lower()
        if key not in self.speaker_rows:
            if key not in self.voices:
                raise InvalidRequestError(f"unknown voice {voice!r}; available: {', '.join(sorted(self.voices))}")
            entry = self.voices[key]
            cond, ref_mel = (to_device(entry[k], self.device, torch.float32) for k in ("cond", "ref_mel"))
            self.speaker_rows[key] = self.model.speaker_rows(cond, ref_mel)
        return self.speaker_rows[key]

    def _times(self, st: Token2WavState) -> torch.Tensor:
        num_steps = st.num_steps or self.model.cfg.flow.num_steps
        if num_steps not in self.times:
            self.times[num_steps] = ode_times(num_steps, self.model.cfg.flow.sway_coefficient, self.device)
        return self.times[num_steps]

    def _rk_step(self, rows: list[_Row]) -> list[torch.Tensor]:
        """One RK step of every row in one batched solve -> each row's new x."""
        lengths = [row.window.num_frames for row in rows]
        total = max(lengths)
        inputs = {
            "x": _pad_stack([row.x for row in rows], total),
            "conditions": _pad_stack([row.conditions for row in rows], total),
            "t0": torch.stack([row.times[row.step] for row in rows]),
            "t1": torch.stack([row.times[row.step + 1] for row in rows]),
            "lengths": to_device(lengths, self.device, torch.long),
        }
        padded = min((f for f in self.dit_graphs if f >= total), default=None)
        if padded is not None and self.dit_graphs[padded].fits(len(rows)):
            out = self.dit_graphs[padded].run(len(rows), inputs)["x"]
            return [out[i, :n].clone() for i, n in enumerate(lengths)]  # (the graph's buffer is reused)
        self.num_eager_calls += bool(self.graph_max_batch)
        out = self._solve_step(**inputs)["x"]
        return [out[i, :n] for i, n in enumerate(lengths)]

    def _solve_step(self, x, conditions, t0, t1, lengths) -> dict[str, torch.Tensor]:
        """x [N, T, mel], conditions [N, 2, T, ...] (``DiT.condition_rows`` padded), times [N] and
        lengths [N] on the device -> {"x": x after one RK step} (no host data: graphable)."""
        conditions = torch.cat([conditions[:, 0], conditions[:, 1]])  # conditioned rows, then unconditioned
        masks = block_masks(self.model.cfg.dit, torch.cat([lengths, lengths]), x.shape[1], x.device)
        guidance = self.model.cfg.flow.guidance_scale

        def velocity(t, h):
            return self.model.dit.velocity(h, t, conditions, masks, guidance)

        return {"x": rk38_step(velocity, t0, t1, x)}

    def _vocoder(self, mel: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"wav": self.model.bigvgan(mel)}

    def _stream_update(self, req, rows: list[_Row], solved) -> tuple[torch.Tensor, int, VocoderSpan | None]:
        """(the request's final mel after its rows solved this step, its end, the span it allows)."""
        stream = self.state_of(req).stream
        done = [(row.window, solved[id(row)]) for row in rows if row.step + 1 == len(row.times) - 1]
        num_final = done[-1][0].keep_end if done else stream.num_final
        return stream.kept_mel(done), num_final, stream.next_span(num_final)

    def _vocode(self, items) -> list[tuple[tuple[EngineRequest, VocoderSpan], torch.Tensor]]:
        """BigVGAN over each (request, final mel, span); spans of equal length decode in one call."""
        groups = defaultdict(list)
        for req, mel, span in items:
            groups[span.end - span.start].append((req, self.state_of(req).stream.span_mel(mel, span), span))
        per_frame = self.model.cfg.bigvgan.samples_per_frame
        out = []
        for frames, group in groups.items():
            mel, graph = torch.stack([mel for _, mel, _ in group]), self.vocoder_graphs.get(frames)
            if graph is not None and graph.fits(len(group)):
                wav = graph.run(len(group), {"mel": mel})["wav"].clone()  # (the graph's buffer is reused)
            else:
                self.num_eager_calls += bool(self.graph_max_batch)
                wav = self._vocoder(mel)["wav"]
            for (req, _, span), row in zip(group, wav, strict=True):
                first = (span.emit_start - span.start) * per_frame
                out.append(((req, span), row[first : first + (span.emit_end - span.emit_start) * per_frame]))
        return out


def _pad_stack(rows: list[torch.Tensor], total: int) -> torch.Tensor:
    """[..., frames_i, C] each -> [N, ..., total, C], zero-padded at the end of the frames."""
    return torch.stack([F.pad(row, (0, 0, 0, total - row.shape[-2])) for row in rows])


def regular_span_lengths(plan: StreamPlan, num_chunks: int = 8) -> list[int]:
    """The frame counts of the vocoder spans a long stream decodes (the first few differ, then every
    span is C + 2V, its last one included: ``StreamPlan.tail_span``)."""
    lengths, num_vocoded = {plan.tail_span}, 0
    for k in range(1, num_chunks + 1):
        emit_end = k * plan.chunk - plan.vocoder_context
        if emit_end > num_vocoded:
            lengths.add(k * plan.chunk - max(0, num_vocoded - plan.vocoder_context))
            num_vocoded = emit_end
    return sorted(lengths)
