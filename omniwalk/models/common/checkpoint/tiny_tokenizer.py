"""A real byte-level BPE tokenizer for tiny checkpoints, laid out like the published omni vocabularies.

Built with the ``tokenizers`` library from a small built-in corpus, then re-numbered so that:

- the 256 byte symbols take ids 0..255 in GPT-2 byte order (so "\\n" is 198, as in the published vocabularies);
- the role words ``system``/``user``/``assistant`` are single tokens at the ids config.json
  names, so ``<|im_start|>assistant\\n`` is exactly three tokens;
- every special token sits at its configured id (the family's spellings);
- the family's text tokens (``<tool_call>``, ``<think>``, ...) are added tokens that are not special,
  as published: atomic when encoding, kept as text by ``decode(skip_special_tokens=True)``;
- the ids up to the first special token are filled with decodable filler words, so any id a
  random model samples decodes to text, and each filler encodes back to its own id (a merge chain
  spells it), as a published vocabulary's words do: a random model's answer, sent back as the next
  turn's text, costs the tokens it was made of, not the several times more its letters would.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from omniwalk.models.common.checkpoint.config import TokenIds

# the published tokenizers' pre-tokenizer split pattern (contractions, letters, single digits, punctuation, spaces).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ENDOFTEXT = "<|endoftext|>"
ROLE_WORDS = ("system", "user", "assistant")
_CORPUS_WORDS = """
the of and to in is you that it he was for on are as with his they at be this have from or one had by
word but not what all were we when your can said there use an each which she do how their if will up
other about out many then them these so some her would make like him into time has look two more write
go see number no way could people my than first water been call who oil its now find long down day did
get come made may part hello world speech audio image video sound voice picture listen answer question
describe what is in this please tell me a story about the weather today thank you very much good morning
omniwalk serves models that think and talk qwen omni streaming text speech server request response model
""".split()


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, in its canonical order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in printable:
        chars[b] = chr(b)
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _byte_alphabet() -> list[str]:
    """The 256 byte symbols in GPT-2 id order: printable bytes first, then the remapped rest."""
    mapping = bytes_to_unicode()
    printable = [b for b in range(256) if mapping[b] == chr(b)]
    rest = [b for b in range(256) if mapping[b] != chr(b)]
    return [mapping[b] for b in printable + rest]


def _corpus() -> list[str]:
    words = _CORPUS_WORDS + list(ROLE_WORDS)
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    role_lines = [f"{w}\n{w} {w}." for w in ROLE_WORDS]
    return (lines + role_lines) * 50


def _trained_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=2000, initial_alphabet=_byte_alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    spec = tok.to_str()
    import json

    model = json.loads(spec)["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


def _pre_tokenizer():
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


FILLER_STEMS = ("Ġz", "Ġzz")  # the merge chain's first links: every filler word extends the last


def _filler(i: int) -> str:
    """A decodable word for filler id i: 'Ġ' (space) + base-26 letters, prefixed to avoid clashes.
    The letters are a numeral without a leading zero ('a'), so a filler's prefixes are fillers of
    smaller ids (the merge chain's links)."""
    letters = ""
    while True:
        letters = chr(ord("a") + i % 26) + letters
        i //= 26
        if i == 0:
            return FILLER_STEMS[-1] + letters


def _filler_merges(fillers: list[str]) -> list[tuple[str, str]]:
    """Merges that spell each filler word from its bytes, one letter at a time, ranked before the
    trained ones (which would otherwise pair its letters first and leave it in pieces)."""
    return [("Ġ", "z"), ("Ġz", "z")] + [(word[:-1], word[-1]) for word in fillers]


def build_tokenizer(tokens: TokenIds, names: dict[str, str], text_tokens: dict[str, int] | None = None) -> Tokenizer:
    """A byte-level BPE tokenizer whose special and role tokens sit at ``tokens``' ids; ``names``:
    each special ``TokenIds`` field's string (a model family's own spelling); ``text_tokens``:
    non-special added tokens -> their ids (inside the special tokens' id range)."""
    trained_vocab, merges = _trained_bpe()
    fixed = {"system": tokens.system, "user": tokens.user, "assistant": tokens.assistant}
    specials = {name: getattr(tokens, field) for field, name in names.items()}
    first_special = min(specials.values())
    specials.setdefault(ENDOFTEXT, first_special - 1)
    first_special = min(specials.values())
    vocab = {sym: i for i, sym in enumerate(_byte_alphabet())}
    taken = set(vocab.values()) | set(fixed.values())
    for word in ROLE_WORDS:
        if word not in trained_vocab:
            raise RuntimeError(f"tokenizer corpus did not produce the role word {word!r}")
    vocab.update(fixed)
    next_id = 256
    for token in sorted(trained_vocab, key=trained_vocab.get) + [s for s in FILLER_STEMS if s not in trained_vocab]:
        if token in vocab:
            continue
        while next_id in taken:
            next_id += 1
        vocab[token] = next_id
        taken.add(next_id)
    filler, fillers = 0, []
    for i in range(next_id, first_special):
        if i in taken:
            continue
        fillers.append(_filler(filler))
        vocab[fillers[-1]] = i
        filler += 1
    if len(set(fillers) | set(trained_vocab)) != len(fillers) + len(trained_vocab):
        raise RuntimeError("the trained vocabulary holds a filler word")  # (its corpus has no 'zz')
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_filler_merges(fillers) + merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    text_tokens = text_tokens or {}
    _add_tokens(tok, specials, text_tokens)
    for name, token_id in {**specials, **text_tokens}.items():
        if tok.token_to_id(name) != token_id:
            raise RuntimeError(f"added token {name} landed at {tok.token_to_id(name)}, expected {token_id}")
    return tok


def _add_tokens(tok: Tokenizer, specials: dict[str, int], text_tokens: dict[str, int]) -> None:
    """Add ``specials`` and ``text_tokens`` (not special) in id order; the other ids between them
    are filled with reserved special placeholders. Each added token takes the next id."""
    by_id = {v: k for k, v in specials.items()}
    if any(i in by_id or not min(by_id) < i < max(by_id) for i in text_tokens.values()):
        raise RuntimeError(f"text tokens {text_tokens} must take free ids inside the special tokens' range")
    by_id.update({v: k for k, v in text_tokens.items()})
    for token_id in range(min(by_id), max(by_id) + 1):
        name = by_id.get(token_id, f"<|reserved_special_token_{token_id}|>")
        if name in text_tokens:
            tok.add_tokens([AddedToken(name, special=False, normalized=False)])
        else:
            tok.add_special_tokens([AddedToken(name, special=True, normalized=False)])
