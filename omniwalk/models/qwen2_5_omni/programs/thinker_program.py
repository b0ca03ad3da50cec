"""The thinker program for Qwen2.5-Omni: the shared one (``models/common/programs/thinker_program.py``),
keeping for a speech request every fed token's talker row: its last hidden state (after the final
norm) + its input embedding, zero at media placeholders (HF's ``generate`` zeroes the prompt's
audio, image and video embeddings before the talker). Prompt rows and reply rows (one per
generated token the thinker fed back) go to the request's ``TalkerState``; a recomputed chunk
(after preemption) writes the same rows again. Speech requests' decode rows replay the captured
decode graph like any other: it returns their last hidden states and input embeddings too
(``graph_outputs``), and ``keep_rows`` keeps them from there.

A forced answer (``/v1/audio/speech``) is committed whole in place of the first draw, so its
tokens were never fed: a speech request's thinker is finished only once it has fed every
generated token but the last (its reply rows; a sampled answer has by then), prefilling them
without a draw."""

from __future__ import annotations

import numpy as np
import torch

from omniwalk.engine.request import EngineRequest
from omniwalk.models.common.programs.thinker_program import ThinkerProgram


class ReplyThinkerProgram(ThinkerProgram):
    graph_outputs = ("hidden", "x")  # a reply row: last hidden state + input embedding

    def num_ready(self, req: EngineRequest, num_cached: int) -> int:
        st = req.state.thinker
        if req.state.talker is not None and st.is_finished:  # (a chunk ending before the last token draws nothing)
            return max(0, st.num_tokens - 1 - num_cached)
        return super().num_ready(req, num_cached)

    def is_finished(self, req: EngineRequest) -> bool:
        st, talker = req.state.thinker, req.state.talker
        return st.is_finished and (talker is None or len(talker.reply) >= st.num_generated - 1)

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
