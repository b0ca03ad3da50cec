"""`omniwalk serve` with injected faults, for the failure-isolation tests.

Run as a script: the patches below sit at module level, so the spawned engine process (which re-
imports this file as its main module) gets them too. In the engine, a request with ``max_tokens ==
13`` fails while its first token is taken, and one with ``max_tokens`` 41 or 2001 takes at least 20
or 40 ms a token (a floor on its run time that no machine's speed removes: 0.8 s and 80 s), so a test can
see it running or know it outlasts a deadline. Its tokens are unchanged. The markers are the engine's
``max_tokens``, which the tiny model's context (4096) bounds: each stays below 4096 less any test's prompt
(a marker clipped to the room left would run at the machine's own speed). In the HTTP process, a
response of exactly 7 completion tokens raises while its body is built (an unexpected server fault).
Every other request runs normally.
"""

import sys
import time

from omniwalk.models.common.programs.thinker_program import ThinkerProgram
from omniwalk.serve import openai_api

FAULT_MAX_TOKENS = 13
FAULT_HTTP_TOKENS = 7
SLOW_TOKEN_S = {41: 0.02, 2001: 0.04}  # max_tokens -> seconds a token at least
_commit = ThinkerProgram._commit
_usage = openai_api.usage


def _faulty_commit(req, pick):
    if req.state.thinker.max_tokens == FAULT_MAX_TOKENS:
        raise RuntimeError("injected engine fault")
    if (seconds := SLOW_TOKEN_S.get(req.state.thinker.max_tokens)) is not None:
        time.sleep(seconds)
    return _commit(req, pick)


def _faulty_usage(output):
    if len(output["token_ids"]) == FAULT_HTTP_TOKENS:
        raise RuntimeError("injected HTTP fault")
    return _usage(output)


ThinkerProgram._commit = staticmethod(_faulty_commit)
openai_api.usage = _faulty_usage

if __name__ == "__main__":
    from omniwalk.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
