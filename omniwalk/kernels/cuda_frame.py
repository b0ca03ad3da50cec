"""The code predictor's frame in one launch of a CUDA kernel (``code_predictor_frame.cu``).

A talker frame draws codec groups 1..G-1 with G-1 passes of the code predictor, each pass a chain of
small dependent steps. The kernel runs one block per SM; each block owns fixed rows of every projection,
and a copy warp of its own streams their weights through a ring of shared memory ahead of the chain, so that
the weight stream can overlap the steps (how far it does: docs/performance.md). A step's outputs carry the
launch's epoch beside each value, so reading a step's input is its wait (the kernel's comment says how).
The kernel is compiled at first use for a batch size by NVRTC through ``torch.cuda`` (the CUDA wheels
carry it: nothing to install), with the shape ``FramePlan`` checks #defined in front.

Every block must be resident at once (a block waits for every other block's rows of the step before):
the kernel takes one SM per block and all of its shared memory, and a wait that spins past its bound
gives up and is reported by ``CudaCodePredictor.check`` rather than hanging the GPU.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from pathlib import Path

import torch

from omniwalk.kernels.frame import FrameWeights, capacity, frame_shape
from omniwalk.kernels.persistent_schedule import Shape
from omniwalk.kernels.sampling import TOP_CANDIDATES

KERNEL = Path(__file__).with_name("code_predictor_frame.cu")
MAX_BATCH = 4  # frames of up to this many requests take the kernel (more: the layered path)
THREADS = 480  # a block's threads that compute (15 warps; the copy warp makes 16: 128 registers a thread)
CHUNK = 8192  # bytes of weights a ring slot holds (one bulk copy of the copy warp)
SHARED_BYTES = 227 * 1024  # shared memory one block may take on sm_90
MAX_RING_CHUNKS = 24


@dataclass(frozen=True)
class FramePlan(Shape):
    """The frame's shape (a ``Shape``: sizes and batch) with its norms' epsilon, on a GPU of ``blocks`` SMs:
    how the kernel lays it out. ``check`` refuses a shape the kernel does not handle (the reasons are the
    kernel's assumptions); ``defines`` are its #defines."""

    eps: float
    blocks: int

    def step_widths(self) -> list[tuple[int, int]]:
        """(rows, K) of each projection a pass streams (gate and up: one step, two segments)."""
        attn = self.heads * self.head_dim
        return [
            (self.qkv, self.hidden),
            (self.hidden, attn),
            (2 * self.intermediate, self.hidden),
            (self.hidden, self.intermediate),
            (self.vocab, self.hidden),
        ]

    def share(self, n: int, block: int) -> range:
        """A block's rows of an n-row projection (the kernel's ``share_start``)."""
        return range(n * block // self.blocks, n * (block + 1) // self.blocks)

    def step_chunks(self) -> int:
        """The most chunks one block's rows of a step take (each segment starts a chunk)."""
        most = 0
        for n, k in self.step_widths():
            segments = 2 if n == 2 * self.intermediate else 1
            rows = -(-(n // segments) // self.blocks)  # (the largest share)
            most = max(most, segments * -(-(rows * k * 2) // CHUNK))
        return most

    @property
    def scratch(self) -> int:
        """Bytes of the room for a step's input rows (bf16), the draw's sort, the attention's vectors and cache."""
        widest = max(self.hidden, self.heads * self.head_dim, self.intermediate)
        group = self.heads // self.kv_heads
        attention = 4 * ((group + 2) * self.head_dim + (group + 2) * self.head_dim // 32 + group + 1)
        attention += 4 * group * capacity(self.groups) + 16  # (then 16-byte aligned:)
        attention += 2 * capacity(self.groups) * self.head_dim * 2  # the cache's keys and values (bf16)
        room = max(2 * self.batch * widest * 2, 12 * self.block_v, attention)  # (the draw: keys, then lists)
        return -(-room // 16) * 16

    @property
    def small(self) -> int:
        """Bytes after the scratch: the ring slots' two barriers, the warps' sums, the rows' norms, the codes drawn,
        the residual at the block's hidden columns."""
        rows = 2 * self.batch
        return 16 * MAX_RING_CHUNKS + 4 * (THREADS // 32 * rows + rows + self.batch + rows * self.res_cols) + 64

    @property
    def res_cols(self) -> int:
        """The most hidden columns one block's rows give (its share of the output projection and the down's)."""
        return -(-self.hidden // self.blocks)

    @property
    def ring_chunks(self) -> int:
        return min(MAX_RING_CHUNKS, (SHARED_BYTES - self.scratch - self.small) // CHUNK)

    @property
    def shared(self) -> int:
        return self.ring_chunks * CHUNK + self.scratch + self.small

    def layout(self) -> dict[str, int]:
        """Where the kernel's outputs lie in its words: per pass and layer, each output's 2B rows from its
        offset in the layer's words (q/k/v, attention, the residual after attention, the MLP's activation, the
        residual after the MLP); a pass's logits (B rows) after its layers, then its codes (B words, where
        B > 1 the drawing blocks hand them on there; a pass's words stay a multiple of 4, the loads' width)."""
        rows, at, out = 2 * self.batch, 0, {}
        for name, width in (
            ("at_qkv", self.qkv),
            ("at_attn", self.heads * self.head_dim),
            ("at_res_a", self.hidden),
            ("at_act", self.intermediate),
            ("at_res_m", self.hidden),
        ):
            out[name], at = at, at + rows * width
        out["layer_words"] = at
        out["at_codes"] = self.layers * at + self.batch * self.vocab
        out["pass_words"] = out["at_codes"] + -(-self.batch // 4) * 4
        return out

    def words(self) -> int:
        """The flagged words of a launch's outputs."""
        return (self.groups - 1) * self.layout()["pass_words"]

    def check(self) -> None:
        group = self.heads // self.kv_heads
        hd = self.head_dim
        problems = []
        if self.batch > MAX_BATCH:
            problems.append(f"batch {self.batch} over {MAX_BATCH}")
        if self.heads % self.kv_heads or (group + 1) * hd > THREADS:
            problems.append(f"a kv head's q heads and k ({group} + 1 heads of {hd}) over {THREADS} threads")
        if hd & (hd - 1) or hd < 2:
            problems.append(f"head_dim {hd} not a power of two")
        if any(k % 8 for _, k in self.step_widths()):
            problems.append("a projection's input width not a multiple of 8")
        if self.vocab % 4 or self.qkv % 4:
            problems.append("vocabulary and q/k/v width must be multiples of 4")
        if self.vocab > 2**16:
            problems.append(f"vocabulary {self.vocab} over 65536 (a code is handed on in 16 bits)")
        if self.blocks < self.batch * self.kv_heads:
            problems.append(f"{self.blocks} blocks for {self.batch * self.kv_heads} attention tiles")
        if self.step_chunks() > self.ring_chunks:
            problems.append(f"a step's rows take {self.step_chunks()} chunks; the ring holds {self.ring_chunks}")
        if self.layout()["pass_words"] >= 2**31:
            problems.append("a pass's words exceed 32-bit offsets")
        if problems:
            raise ValueError(f"the CUDA frame kernel does not take this shape ({self}): " + "; ".join(problems))

    def defines(self, trace: bool = False) -> dict[str, object]:
        return dict(
            batch=self.batch,
            hidden=self.hidden,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            intermediate=self.intermediate,
            vocab=self.vocab,
            block_v=self.block_v,
            groups=self.groups,
            layers=self.layers,
            capacity=capacity(self.groups),
            candidates=min(TOP_CANDIDATES, self.block_v),  # (a top_k up to this: the best-64 lists)
            threads=THREADS,
            chunk=CHUNK,
            ring_chunks=self.ring_chunks,
            res_cols=self.res_cols,
            scratch=self.scratch,
            eps=f"{self.eps:.9e}f",
            scale=f"{self.head_dim**-0.5:.9e}f",
            trace=int(trace),
            **self.layout(),
        )

    @property
    def steps(self) -> int:
        """A frame's steps as the kernel numbers them (per pass: five a layer, then the head)."""
        return (self.groups - 1) * (5 * self.layers + 1)

    @property
    def trace_rows(self) -> int:
        """Rows of a traced launch's stamps: the steps, then a pass's draw each."""
        return self.steps + self.groups - 1


def source(plan: FramePlan, trace: bool = False, kernel: Path | None = None) -> str:
    """The kernel's source (``kernel``, else ``KERNEL``) with ``plan``'s #defines in front (``trace``: the
    variant that stamps its steps)."""
    defines = "".join(f"#define {name.upper()} {value}\n" for name, value in plan.defines(trace).items())
    return defines + (kernel or KERNEL).read_text()


class CudaCodePredictor:
    """``CodePredictor.forward`` for frames of up to ``MAX_BATCH`` requests in one launch of
    ``code_predictor_frame.cu`` (bf16 weights). The layers' weights are stacked per kind once (the modules'
    parameters become views of the stacks). Per batch size: the kernel, its outputs' words and the
    attention blocks' caches, made at the first frame of that size (before a graph capture), from the source
    ``KERNEL`` named when the predictor was made (a benchmark may make predictors of other sources beside it)."""

    max_batch = MAX_BATCH

    def __init__(self, cp, cos: torch.Tensor, sin: torch.Tensor):
        p = cp.lm_head[0].weight
        if p.dtype != torch.bfloat16 or p.device.type != "cuda":
            raise ValueError(f"the CUDA frame kernel takes bf16 weights on a CUDA device, not {p.dtype} on {p.device}")
        self.weights = FrameWeights.of(cp)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        self.device, self.kernel = p.device, KERNEL
        self._shape, self._eps = (lambda batch: frame_shape(cp, batch)), cp.cfg.rms_norm_eps
        self._blocks = torch.cuda.get_device_properties(p.device).multi_processor_count
        self.plan(1).check()
        self._built: dict[int, tuple] = {}
        self._kernels: dict[tuple[int, bool], object] = {}
        # a benchmark's timeline: an int64 tensor [blocks, plan.trace_rows, 4] (each block's global timer at each
        # step's start, input read, weights in, end; then each draw's) the next launches fill; None: not recorded
        self.trace: torch.Tensor | None = None

    def plan(self, batch: int) -> FramePlan:
        return FramePlan(*astuple(self._shape(batch)), self._eps, self._blocks)

    def _kernel(self, batch: int) -> tuple:
        """The kernel for ``batch`` rows (the tracing variant where ``trace`` is set), its plan, and its state:
        outputs' words, K/V caches, sync words (the epoch, blocks finished, a wait given up)."""
        traced = self.trace is not None
        if (batch, traced) not in self._kernels:
            plan = self.plan(batch)
            plan.check()
            fn = torch.cuda._compile_kernel(
                source(plan, traced, self.kernel), "code_predictor_frame", nvcc_options=["-std=c++17"]
            )
            allow_shared_memory(fn, plan.shared)
            self._kernels[(batch, traced)] = fn
        if batch not in self._built:
            plan = self.plan(batch)
            words = torch.zeros(plan.words(), dtype=torch.int32, device=self.device)
            cache = (plan.layers, batch, plan.kv_heads, capacity(plan.groups), plan.head_dim)
            keys = torch.zeros(cache, dtype=torch.bfloat16, device=self.device)
            values = torch.zeros_like(keys)
            sync = torch.zeros(3, dtype=torch.int32, device=self.device)
            self._built[batch] = (plan, words, keys, values, sync)
        return (self._kernels[(batch, traced)], *self._built[batch])

    def __call__(self, talker_hidden: torch.Tensor, code0_embedding: torch.Tensor, params) -> tuple:
        """As ``CodePredictor.forward`` with draws by ``sampling.draw(logits, params, group - 1)``:
        (codes [B, G-1] int64, the sum of their embeddings [B, hidden]). No host reads: graph-capturable."""
        from omniwalk.kernels.sampling import _param_args

        batch, hidden = talker_hidden.shape
        fn, plan, words, keys, values, sync = self._kernel(batch)
        x0 = torch.stack([talker_hidden, code0_embedding], dim=1).reshape(2 * batch, hidden).to(torch.bfloat16)
        codes = torch.empty(batch, plan.groups - 1, dtype=torch.long, device=self.device)
        total = torch.zeros(batch, hidden, dtype=torch.bfloat16, device=self.device)
        args, flags = _param_args(params, self.device, skip_front=False)
        trace = codes if self.trace is None else self.trace  # (unused where not traced)
        weights = [*self.weights.tensors(), self.cos, self.sin]
        fn(
            grid=(plan.blocks, 1, 1),
            block=(THREADS + 32, 1, 1),  # (and the copy warp)
            args=[*weights, x0.contiguous(), words, keys, values, codes, total, sync, *args, flags, trace],
            shared_mem=plan.shared,
        )
        return codes, total

    def check(self) -> None:
        """Raise if a wait of an earlier launch gave up (a host read: not inside a graph capture)."""
        for batch, (*_, sync) in self._built.items():
            if sync[2].item():
                raise RuntimeError(f"a wait of the CUDA frame kernel (batch {batch}) gave up: its outputs are wrong")


def allow_shared_memory(fn, size: int) -> None:
    """Raise the kernel's dynamic shared-memory limit past 48 KiB (older torch: through the driver)."""
    if hasattr(fn, "set_shared_memory_config"):
        fn.set_shared_memory_config(size)
        return
    max_dynamic_shared_size = 8  # (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
    torch.cuda._utils._get_gpu_runtime_library().cuFuncSetAttribute(fn.func, max_dynamic_shared_size, size)
