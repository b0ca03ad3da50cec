"""The thinker program for Qwen2.5-Omni: the shared one (``models/common/programs/thinker_program.py``),
keeping for a speech request every fed token's talker row: its last hidden state (after the final
norm) + its input embedding, zero at media placeholders (HF's ``generate`` zeroes the prompt's
audio, image and video embeddings before the talker). Prompt rows and reply rows (one per
generated token the thinker fed back) go to the request's ``TalkerState``; a recomputed chunk
(after preemption) writes the same rows again. Rows of speech requests run eagerly (the captured
decode graph returns logits only)."""

from __future__ import annotations

import numpy as np
import torch

from omniwalk.engine.request import Chunk, EngineRequest
from omniwalk.models.common.programs.thinker_program import ThinkerProgram


class ReplyThinkerProgram(ThinkerProgram):
    @staticmethod
    def _decode_rows(batch: list[Chunk]) -> list[bool]:
        rows = ThinkerProgram._decode_rows(batch)
        return [is_decode and chunk.req.state.talker is None for is_decode, chunk in zip(rows, batch, strict=True)]

    def keep_rows(self, req: EngineRequest, start: int, n: int, x, out: dict, offset: int) -> None:
        talker = req.state.talker
        if talker is None:
            return
        th = req.state.thinker
        rows = out["hidden"][offset : offset + n] + x[offset : offset + n]
        num_prompt = th.prompt.num_prompt_tokens
        if start < num_prompt:
            ids = np.asarray(th.prompt.token_ids[start : min(start + n, num_prompt)])
            media = torch.from_numpy(np.isin(ids, list(self.pad_ids.values())))
            prompt = out["hidden"][offset : offset + len(ids)]  # the embedding part is zero at media rows
            talker.keep_prompt(start, num_prompt, torch.where(media.to(rows.device)[:, None], prompt, rows[: len(ids)]))
        for i in range(max(start, num_prompt), start + n):
            talker.keep_reply(i - num_prompt, rows[i - start])
