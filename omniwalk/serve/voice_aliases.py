"""OpenAI's voice names served by the checkpoint's voices.

Clients and agent frameworks send OpenAI's voices (the Agents SDK's realtime default is ``ash``);
a Qwen omni checkpoint has its own speakers (Qwen3-Omni: chelsie, ethan, aiden). A request may name
either: a name of the alias table is served by the voice it maps to. The table is the default one
below, resolved against the checkpoint's voices (each OpenAI voice to the first of its preferred
voices the checkpoint has, else to the checkpoint's first voice), with the server's
``voice_aliases`` entries (``--voice-alias NAME=VOICE``) over it. A given entry must name a voice
of the checkpoint, and must not be one (``check_voice_aliases``, at start-up).

    OpenAI voice                                   preferred voices (in order)
    alloy coral marin nova sage shimmer            chelsie
    ash cedar echo onyx                            ethan
    ballad fable verse                             aiden, ethan
"""

from __future__ import annotations

from omniwalk.errors import ConfigError

_FEMININE, _MASCULINE = ("chelsie",), ("ethan",)
DEFAULT_ALIASES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("alloy", "coral", "marin", "nova", "sage", "shimmer"), _FEMININE),
    **dict.fromkeys(("ash", "cedar", "echo", "onyx"), _MASCULINE),
    **dict.fromkeys(("ballad", "fable", "verse"), ("aiden", "ethan")),
}


def given_aliases(entries: tuple[str, ...]) -> dict[str, str]:
    """``("ash=ethan", ...)`` -> {"ash": "ethan", ...} (lower case; a later entry for a name wins)."""
    pairs = (entry.partition("=") for entry in entries)
    return {name.strip().lower(): voice.strip().lower() for name, _, voice in pairs}


def alias_table(entries: tuple[str, ...], voices: tuple[str, ...]) -> dict[str, str]:
    """The aliases a checkpoint with ``voices`` serves (none when it does not speak)."""
    if not voices:
        return {}
    table = {name: next((v for v in liked if v in voices), voices[0]) for name, liked in DEFAULT_ALIASES.items()}
    table.update({name: voice for name, voice in given_aliases(entries).items() if voice in voices})
    return {name: voice for name, voice in table.items() if name not in voices}


def check_voice_aliases(entries: tuple[str, ...], voices: tuple[str, ...]) -> None:
    """ConfigError for an entry that names a voice the checkpoint lacks, or whose name is one of its
    voices (an alias never hides a voice). Nothing to check for a checkpoint without speech."""
    if not voices:
        return
    for name, voice in given_aliases(entries).items():
        if voice not in voices:
            raise ConfigError(
                f"voice alias {name}={voice}: the checkpoint has no voice {voice!r} (its voices: {', '.join(voices)})"
            )
        if name in voices:
            raise ConfigError(f"voice alias {name}={voice}: {name!r} is a voice of the checkpoint; alias another name")
