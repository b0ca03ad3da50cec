"""Tokenizer wrapper over the ``tokenizers`` library (no transformers at run time).

``IncrementalDetokenizer`` turns a growing list of token ids into text deltas. Byte-level BPE
tokens can split a UTF-8 character, so a delta is only emitted once the decoded text no longer
ends in the replacement character; the held-back bytes come out with the token that completes
them (or, at the very end, as whatever ``decode`` makes of them).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

from omniwalk.errors import CheckpointError

REPLACEMENT = "\ufffd"


class Tokenizer:
    def __init__(self, tokenizer: _HFTokenizer, chat_template: str | None = None):
        self._tok = tokenizer
        self.chat_template = chat_template

    @classmethod
    def from_dir(cls, ckpt_dir: str | Path) -> Tokenizer:
        ckpt_dir = Path(ckpt_dir)
        path = ckpt_dir / "tokenizer.json"
        if not path.exists():
            raise CheckpointError(f"{ckpt_dir}: no tokenizer.json")
        return cls(_HFTokenizer.from_file(str(path)), read_chat_template(ckpt_dir))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Text -> ids; special-token strings in ``text`` become their ids (like HF's default)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens)


def read_chat_template(ckpt_dir: Path) -> str | None:
    """The checkpoint's chat template, found where transformers looks for it (published checkpoints
    differ). The processor's places come first, in the order ``AutoProcessor`` reads them:
    processor_config.json's ``chat_template``, then chat_template.json (``{"chat_template": ...}``),
    then chat_template.jinja; last, tokenizer_config.json's ``chat_template``, which ``AutoTokenizer``
    reads when there is no chat_template.jinja. None when there is none."""
    jinja = ckpt_dir / "chat_template.jinja"
    for name in ("processor_config.json", "chat_template.json", jinja.name, "tokenizer_config.json"):
        path = ckpt_dir / name
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        template = text if path == jinja else json.loads(text).get("chat_template")
        if template is None:
            continue
        if not isinstance(template, str):
            raise CheckpointError(f"{path}: chat_template must be one template (a string), not named templates")
        return template
    return None


class IncrementalDetokenizer:
    """Feed ids one step at a time; get back only complete new text.

    Decodes a short window (``ids[prefix:]``, starting at the last emitted character boundary)
    rather than the whole sequence each step, so the cost per token is constant. Byte-level
    BPE decodes each window independently of the tokens before it.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # ids[:read] are already emitted as text
        self.text = ""

    def add(self, new_ids: list[int]) -> str:
        """Append ids and return the text they complete (possibly empty)."""
        self.ids.extend(new_ids)
        prefix_text = self._tok.decode(self.ids[self._prefix : self._read], self._skip)
        full_text = self._tok.decode(self.ids[self._prefix :], self._skip)
        if full_text.endswith(REPLACEMENT) or len(full_text) <= len(prefix_text):
            return ""  # an incomplete character: wait for the token that completes it
        delta = full_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Emit whatever is held back (at end of stream), replacement characters included."""
        prefix_text = self._tok.decode(self.ids[self._prefix : self._read], self._skip)
        full_text = self._tok.decode(self.ids[self._prefix :], self._skip)
        delta = full_text[len(prefix_text) :]
        self._prefix = self._read = len(self.ids)
        self.text += delta
        return delta
