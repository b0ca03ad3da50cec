"""/v1/audio/speech's engine side: a forced answer is committed whole after the prompt's prefill
(no thinker decode steps) and the talker voices exactly it."""

from helpers.qwen3_omni import omni

from omniwalk.models.common.programs.thinker_program import ThinkerProgram

TEXT = "the quick brown fox jumps over the lazy dog and runs far away"  # 12 words
SPEECH = {"talker_temperature": 0.0, "code_predictor_temperature": 0.0, "min_audio_frames": 6, "max_audio_frames": 6}


def test_a_forced_answer_is_spoken_without_thinker_decode_steps(monkeypatch):
    o = omni("tiny")
    rows = []
    run = ThinkerProgram.run

    def spy(self, batch, kv):
        rows.extend((req.id, start, n, req.state.thinker.prompt.num_prompt_tokens) for req, start, n in batch)
        return run(self, batch, kv)

    monkeypatch.setattr(ThinkerProgram, "run", spy)
    request = {
        "messages": [{"role": "system", "content": "Read aloud."}, {"role": "user", "content": TEXT}],
        "modalities": ["text", "audio"],
        "forced_answer": TEXT,
        "request_id": "speech",
        **SPEECH,
    }
    out = o.generate(request)
    assert out.text == TEXT and out.finish_reason == "stop"
    assert out.token_ids == o.family.tokenizer.encode(TEXT) + [o.family.cfg.tokens.im_end]
    mine = [(start, n, num_prompt) for rid, start, n, num_prompt in rows if rid == "speech"]
    assert mine and all(start + n <= num_prompt for start, n, num_prompt in mine)  # prompt rows only
    assert out.codes.shape[0] == 6 and len(out.audio) > 0
