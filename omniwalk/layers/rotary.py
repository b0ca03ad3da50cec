"""Rotary position embeddings (NeoX / rotate-half layout over the whole head dim).

``cos``/``sin`` have shape [tokens, head_dim] in fp32; positions may be float (video MRoPE).

Multimodal RoPE (MRoPE) gives every token three positions (T, H, W). Each of the
``head_dim / 2`` frequency slots reads one of the three rows; the interleaved layout is

    slot:  0 1 2 3 4 5 ...   3*s_h-1 ...  head_dim/2-1
    axis:  T H W T H W ...               T T T T      (H at i%3==1 while i < 3*s_h,
                                                       W at i%3==2 while i < 3*s_w, else T)

with ``mrope_section = (s_t, s_h, s_w)`` counting each axis's slots. The sectioned layout
(``interleaved=False``) gives each axis one contiguous run of slots instead:

    slot:  0 ... s_t-1 | s_t ... s_t+s_h-1 | ... head_dim/2-1
    axis:  T ...  T    | H   ...  H        | W ...  W
"""

from functools import cache

import torch


def rotary_tables(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., tokens, head_dim] (fp32) -> what ``apply_rotary`` takes: both with a heads
    axis before the last, rounded to ``dtype``, sin's first half negated. Built once per forward
    and shared by every layer's q and k.

    NOTE: rounding to x's dtype first is what HF does for the thinker and talker (bf16 results
    track the reference's rounding); negating sin instead of x's half is exact.
    """
    half = sin.shape[-1] // 2
    sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos.unsqueeze(-2).to(dtype), sin.unsqueeze(-2).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., tokens, heads, head_dim]; cos/sin from ``rotary_tables`` (broadcast over heads):
    ``x * cos + rotate_half(x) * sin`` with rotate_half(x) = (-x2, x1), in x's dtype."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


def inv_frequencies(head_dim: int, theta: float, device=None) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)


@cache
def _inv_frequencies_on(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """``inv_frequencies`` on ``device``, made once (four kernels fewer in every decode step's tables); a
    plain tensor even when first asked for under inference mode."""
    with torch.inference_mode(False):
        return inv_frequencies(head_dim, theta, device)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D rope: positions [tokens] -> cos, sin [tokens, head_dim] in fp32."""
    freqs = positions.float()[:, None] * _inv_frequencies_on(head_dim, theta, positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def mrope_axes(mrope_section: tuple[int, ...], interleaved: bool = True) -> torch.Tensor:
    """Which position row (0=T, 1=H, 2=W) each of the ``sum(mrope_section)`` slots reads."""
    if not interleaved:
        return torch.repeat_interleave(torch.arange(3), torch.tensor(mrope_section))
    num_slots = sum(mrope_section)
    axes = torch.zeros(num_slots, dtype=torch.long)
    for axis in (1, 2):
        axes[axis : 3 * mrope_section[axis] : 3] = axis
    return axes


@cache
def _axes_on(mrope_section: tuple[int, ...], interleaved: bool, device: torch.device) -> torch.Tensor:
    """``mrope_axes`` on ``device``, copied there once (no per-step host transfer)."""
    return mrope_axes(mrope_section, interleaved).to(device)


def mrope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, mrope_section: tuple[int, ...], interleaved: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """MRoPE: positions [3, tokens] (T, H, W rows) -> cos, sin [tokens, head_dim] in fp32."""
    axes = _axes_on(tuple(mrope_section), interleaved, positions.device)
    slot_positions = positions.float()[axes].T  # [tokens, head_dim/2]: each slot's own row
    freqs = slot_positions * _inv_frequencies_on(head_dim, theta, positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def head_rope_reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """qkv [M, T, 3 * heads * d] -> a new tensor with q's and k's head 0 rotated (Qwen2.5-Omni's DiT;
    the oracle of ``kernels/head_rope.py``, which says why head 0 alone)."""
    m, t, width = qkv.shape
    d = width // (3 * heads)
    parts = qkv.view(m, t, 3, heads, d)
    first = apply_rotary(parts[:, :, :2, 0], cos, sin)  # q's and k's head 0 [M, T, 2, d] (cos/sin broadcast)
    qk = torch.cat((first.unsqueeze(3), parts[:, :, :2, 1:]), dim=3)
    return torch.cat((qk, parts[:, :, 2:]), dim=2).reshape(m, t, width)
