"""xgrammar against llguidance on one tokenizer: schema compile time, per-step mask time at B = 1 and 32,
and which of the corpus's JSON Schemas each compiles (omniwalk/bench/schemas.py).

    python benchmarks/structured/grammar_engines.py CHECKPOINT [--steps 64] [--out DIR]

CHECKPOINT: a checkpoint directory with tokenizer.json (`omniwalk make-tiny DIR` writes one with the
Qwen3-Omni vocabulary's 152,064 ids). Each step fills every row's bitmask, then advances each row
by one allowed token (a seeded random pick), as a constrained decode does. CPU only. xgrammar is not a
dependency of omniwalk: `pip install xgrammar` first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from omniwalk.bench.schemas import SCHEMAS


def _vocab_size(ckpt: Path) -> int:
    cfg = json.loads((ckpt / "config.json").read_text())
    thinker = cfg.get("thinker_config", cfg)
    return thinker.get("text_config", thinker).get("vocab_size")


class XGrammar:
    name = "xgrammar"

    def __init__(self, ckpt: Path, vocab: int):
        import xgrammar as xgr
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
        encoded = [""] * vocab
        for text, i in tok.get_vocab(with_added_tokens=True).items():
            if i < vocab:
                encoded[i] = text
        eos = tok.token_to_id("<|im_end|>")
        self.xgr = xgr
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab, stop_token_ids=[eos])
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.vocab = vocab

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def matchers(self, compiled, n: int):
        return [self.xgr.GrammarMatcher(compiled) for _ in range(n)]

    def bitmask(self, n: int):
        return self.xgr.allocate_token_bitmask(n, self.vocab)

    def fill(self, matchers, mask) -> None:
        for row, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, row)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_terminated()


class LLGuidance:
    name = "llguidance"

    def __init__(self, ckpt: Path, vocab: int):
        import llguidance
        import llguidance.numpy as llnp
        from tokenizers import Tokenizer

        eos = Tokenizer.from_file(str(ckpt / "tokenizer.json")).token_to_id("<|im_end|>")
        self.ll, self.llnp = llguidance, llnp
        self.tok = llguidance.LLTokenizer((ckpt / "tokenizer.json").read_text(), n_vocab=vocab, eos_token=eos)
        self.executor = llguidance.LLExecutor()
        self.vocab = vocab

    def compile(self, schema: dict):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        matcher = self.ll.LLMatcher(self.tok, grammar)  # (grammars compile lazily, per matcher)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return grammar

    def matchers(self, compiled, n: int):
        return [self.ll.LLMatcher(self.tok, compiled) for _ in range(n)]

    def bitmask(self, n: int):
        return self.llnp.allocate_token_bitmask(n, self.vocab)

    def fill(self, matchers, mask) -> None:
        if len(matchers) == 1:
            self.llnp.fill_next_token_bitmask(matchers[0], mask, 0)
        else:
            self.llnp.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], mask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_stopped()


def _allowed(mask_row, vocab: int) -> np.ndarray:
    bits = np.unpackbits(np.asarray(mask_row).view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)


def measure(engine, steps: int, batches: tuple[int, ...]) -> dict:
    compile_ms, failed = {}, {}
    compiled = {}
    for name, schema in SCHEMAS.items():
        start = time.perf_counter()
        try:
            compiled[name] = engine.compile(schema)
        except Exception as e:  # noqa: BLE001 (coverage: which schemas this engine refuses, and why)
            failed[name] = str(e)[:200]
            continue
        compile_ms[name] = (time.perf_counter() - start) * 1e3
    rng = np.random.default_rng(0)
    names = list(compiled)
    mask_ms = {}
    for b in batches:
        matchers = [m for i in range(b) for m in engine.matchers(compiled[names[i % len(names)]], 1)]
        mask = engine.bitmask(b)
        times = []
        for _ in range(steps):
            for row, m in enumerate(matchers):
                if engine.done(m):
                    matchers[row] = engine.matchers(compiled[names[row % len(names)]], 1)[0]
            start = time.perf_counter()
            engine.fill(matchers, mask)
            times.append((time.perf_counter() - start) * 1e3)
            for row, m in enumerate(matchers):
                allowed = _allowed(mask[row], engine.vocab)
                if len(allowed) == 0:
                    raise RuntimeError(f"{engine.name}: no token allowed in row {row}")
                engine.accept(m, int(rng.choice(allowed)))
        mask_ms[b] = {"median": statistics.median(times), "p90": sorted(times)[int(0.9 * len(times))]}
    return {
        "compiled": len(compile_ms),
        "refused": failed,
        "compile_ms_median": statistics.median(compile_ms.values()),
        "compile_ms_max": max(compile_ms.values()),
        "mask_ms": mask_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    vocab = _vocab_size(args.checkpoint)
    batches = tuple(int(b) for b in args.batches.split(","))
    results = {}
    for cls in (XGrammar, LLGuidance):
        start = time.perf_counter()
        engine = cls(args.checkpoint, vocab)
        setup = time.perf_counter() - start
        print(f"{cls.name}: tokenizer set up in {setup:.2f} s; measuring {len(SCHEMAS)} schemas ...", flush=True)
        results[cls.name] = {"tokenizer_setup_s": setup, **measure(engine, args.steps, batches)}
        r = results[cls.name]
        print(
            f"  compiled {r['compiled']}/{len(SCHEMAS)} (median {r['compile_ms_median']:.1f} ms, "
            f"max {r['compile_ms_max']:.1f} ms); mask per step: "
            + ", ".join(f"B={b} {v['median']:.3f} ms" for b, v in r["mask_ms"].items())
        )
        for name, why in r["refused"].items():
            print(f"  refused {name}: {why}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "grammar_engines.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
