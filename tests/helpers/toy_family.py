"""A second model family on the socket (``omniwalk/models/family.py``): the engine-core toy LM,
text in, text out, one KV stage. It names nothing of Qwen3-Omni.

A checkpoint is a directory whose config.json names the ``ToyLM`` architecture. The family is
registered as an installed package registers one: a ``.dist-info`` folder on ``sys.path`` with an
``omniwalk.families`` entry point naming this module (``install``), so a server's engine process
finds it too. The module defines ``Family`` and ``Options`` (``omniwalk/models/registry.py``).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from helpers.toy_lm import DIM, HEADS, ToyLM, ToyProgram

from omniwalk.engine.kv_pages import KVStorage, PagePool
from omniwalk.engine.kv_stage import KVStage, KVStageConfig
from omniwalk.errors import InvalidRequestError
from omniwalk.models.family import ModelFamily, ModelInfo, RequestOutput
from omniwalk.sampling import SamplingParams

ARCHITECTURE = "ToyLM"
ALPHABET = " abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789."  # token id = index (64)


def encode(text: str) -> list[int]:
    return [ALPHABET.find(c) if c in ALPHABET else len(ALPHABET) - 1 for c in text]


def decode(ids: list[int]) -> str:
    return "".join(ALPHABET[i] for i in ids)


class TextProgram(ToyProgram):
    """The toy LM's program, streaming each token as its character."""

    def commit(self, req, token):
        req.state["seq"].append(token)
        req.emit("text", ALPHABET[token])


@dataclass(frozen=True)
class Options:
    """The family's own config section: ``Omni`` keywords and ``omniwalk serve`` flags."""

    toy_kv_pages: int = 1024  # pages of 4 tokens


class ToyFamily(ModelFamily):
    info = ModelInfo(name="toy-lm")

    def __init__(self, config):
        self.config, self.model = config, ToyLM()

    def build_stages(self):
        storage = KVStorage(PagePool(self.config.family.toy_kv_pages, 4), 1, HEADS, DIM // HEADS, torch.float32, "cpu")
        budget = self.config.engine.max_batch_tokens
        return [KVStage("lm", TextProgram(self.model), storage, KVStageConfig(budget, 64), "cpu")]

    def new_request(self, request):
        params = SamplingParams.from_request(request)  # (greedy whatever it asks; its fields are checked)
        text = "\n".join(m["content"] for m in request.get("messages") or () if isinstance(m.get("content"), str))
        if not text:
            raise InvalidRequestError("the toy LM reads text messages only")
        prompt = encode(text)
        return ("lm",), {"seq": prompt, "num_prompt": len(prompt), "stop_at": len(prompt) + params.max_tokens}

    def output(self, req):
        seq, n = req.state["seq"], req.state["num_prompt"]
        reason = "length" if len(seq) == req.state["stop_at"] else None
        return RequestOutput(req.id, seq[:n], seq[n:], decode(seq[n:]), reason)

    def decode(self, ids):
        return decode(ids)

    @classmethod
    def make_tiny(cls, out_dir, config=None, seed=0, **options):
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "config.json").write_text(json.dumps({"architectures": [ARCHITECTURE]}))
        return Path(out_dir)

    @classmethod
    def describe(cls, path):
        return f"toy LM: vocabulary {len(ALPHABET)}, width {DIM}, {HEADS} heads"


Family = ToyFamily


def install(site: Path) -> Path:
    """Register the family in ``site`` (to be put on sys.path / PYTHONPATH) as an installed package would."""
    dist = site / "toy_family-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-family\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[omniwalk.families]\n{ARCHITECTURE} = helpers.toy_family\n")
    return site
