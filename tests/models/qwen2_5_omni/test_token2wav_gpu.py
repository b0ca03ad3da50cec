"""Qwen2.5-Omni token2wav's CUDA graphs (the batched RK step per padded length, BigVGAN per span
length) against the same program eager, on the GPU with the full-size 7B token2wav config (fp32,
random audible weights): a mixed batch of streamed requests (windows joining and leaving between
steps) and one-shot decodes (eager by design: rows longer than any graph)."""

import pytest
import torch
import torch.nn.functional as F

from omniwalk.engine.batch_stage import BatchStage, BatchStageConfig
from omniwalk.engine.request import EngineRequest
from omniwalk.layers.decoder import use_kernels
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import audible_token2wav, load_config_dict
from omniwalk.models.qwen2_5_omni.networks.token2wav import Token2Wav
from omniwalk.models.qwen2_5_omni.programs.token2wav_program import Token2WavProgram, Token2WavState

pytestmark = pytest.mark.gpu
# (codes, codes the talker adds per step, one-shot): 1 to 5 windows of 144 mel frames, two one-shot
JOBS = [(40, 4), (120, 6), (90, 3), (200, 8), (64, 5), (150, 7), (33, 2)]
ONE_SHOT = {1, 5}


@pytest.fixture(scope="module")
def model_and_voices():
    cfg = Qwen25OmniConfig.from_hf(load_config_dict("qwen2.5-omni-7b")).token2wav
    g = torch.Generator().manual_seed(3)
    voices = {
        name: {
            "cond": torch.randn(1, cfg.dit.enc_emb_dim, generator=g),
            "ref_mel": torch.randn(1, 30, cfg.dit.mel_dim, generator=g) - 4.0,
        }
        for name in ("chelsie", "ethan")
    }
    model = Token2Wav(cfg).cuda().eval()
    audible_token2wav(model, voices["chelsie"], 0)
    use_kernels(model, "fused")  # (the served fast path: the graphs record its kernels)
    return model, voices


def run(model, voices, graph_max_batch: int) -> tuple[dict[str, torch.Tensor], dict]:
    program = Token2WavProgram(model, voices, "cuda", state_of=lambda req: req.state, graph_max_batch=graph_max_batch)
    program.capture_graphs()
    stage = BatchStage("token2wav", program, BatchStageConfig(max_batch_units=16384), "cuda")
    g = torch.Generator().manual_seed(1)
    jobs = []
    for i, (n, per_step) in enumerate(JOBS):
        codes = torch.randint(0, model.cfg.dit.num_embeds, (n,), generator=g).tolist()
        st = Token2WavState(("chelsie", "ethan")[i % 2], seed=i, num_steps=(4, 10)[i % 2], one_shot=i in ONE_SHOT)
        req = EngineRequest(f"r{i}", ("token2wav",), st)
        stage.add(req)
        jobs.append((req, codes, per_step))
    for _ in range(10_000):
        for req, codes, per_step in jobs:
            st = req.state
            st.codes.extend(codes[len(st.codes) : len(st.codes) + per_step])
            st.finished = len(st.codes) == len(codes)
        stage.step()
        stage.finish()
        if all(stage.is_done(req) for req, _, _ in jobs):
            break
    assert all(req.error is None for req, _, _ in jobs)
    return {req.id: torch.cat(req.state.chunks) for req, _, _ in jobs}, program.stats()


@torch.inference_mode()
def test_graphs_equal_eager(model_and_voices):
    eager, _ = run(*model_and_voices, graph_max_batch=0)
    graphed, stats = run(*model_and_voices, graph_max_batch=16)
    assert stats["graph_replays"] > 0 and stats["eager_calls"] > 0  # (one-shot rows and end spans: eager)
    for rid, ref in eager.items():
        out = graphed[rid]
        assert out.shape == ref.shape and ref.std() > 0.01
        # padded rows and batch shapes round differently (fp32; cuDNN convolutions may use TF32)
        assert F.cosine_similarity(out.double(), ref.double(), dim=0) >= 0.99999, rid
        assert (out - ref).abs().max() < 2e-3, rid
