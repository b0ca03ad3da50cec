"""Rotary position embeddings (NeoX / rotate-half layout over the whole head dim).

``cos``/``sin`` have shape [..., tokens, head_dim]; positions may be float (video MRoPE).
"""

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; cos/sin: [tokens, head_dim] (broadcast over heads)."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


def inv_frequencies(head_dim: int, theta: float, device=None) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D rope: positions [tokens] -> cos, sin [tokens, head_dim] in fp32."""
    freqs = positions.float()[:, None] * inv_frequencies(head_dim, theta, positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()
