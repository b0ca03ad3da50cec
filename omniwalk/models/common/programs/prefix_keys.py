"""Keys of a prompt's KV pages: a page's key names everything its rows depend on (the ids, positions
and media content before its end, chained from the key of the page before), so a request whose prompt
begins alike takes those pages instead of computing them (``engine/kv_stage.py``)."""

from __future__ import annotations

import hashlib

import numpy as np

from omniwalk.media.preprocess import feed_digest


def item_digest(item) -> bytes:
    """A digest of a media item's content (its kind, measures and encoder input, ``MediaItem``): in a
    prefix key it stands for the rows its placeholders get. Made once per item, from its part's digest
    where the HTTP process made one (``MediaItem.source_digest``), else from its data."""
    if item.digest is None:
        h = hashlib.blake2b(digest_size=16)
        h.update(repr((item.kind, item.num_audio_tokens, tuple(item.grid_thw), item.seconds_per_grid)).encode())
        if item.source_digest is not None:
            h.update(item.source_digest)
        else:
            feed_digest(h, item.data)
        item.digest = h.digest()
    return item.digest


def prefix_chain(seed: bytes, prompt, ends: list[int], extra: list[bytes] | None = None) -> list[bytes]:
    """One key per prompt index of ``ends`` (increasing): a digest chained from ``seed`` over every
    id and position before that index, the content of every media item whose placeholders start
    before it (``item_digest``: two prompts alike but for an image differ from the page it starts
    in), and ``extra[j]`` (what else the j-th key's page depends on)."""
    if not ends:
        return []
    ids = np.asarray(prompt.token_ids, dtype=np.int64)
    positions = prompt.rope.span(0, ends[-1]).numpy()
    starts = [span.start for span in prompt.spans]
    keys, digest, begin, item = [], seed, 0, 0
    for j, end in enumerate(ends):
        parts = [digest, ids[begin:end].tobytes(), np.ascontiguousarray(positions[:, begin:end]).tobytes()]
        while item < len(starts) and starts[item] < end:
            parts.append(item_digest(prompt.items[item]))
            item += 1
        parts += [extra[j]] if extra else []
        digest = hashlib.blake2b(b"".join(parts), digest_size=16).digest()
        keys.append(digest)
        begin = end
    return keys
