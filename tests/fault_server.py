"""`omniwalk serve` with one injected engine fault, for the HTTP failure-isolation test.

Run as a script: the patch below sits at module level, so the spawned engine process (which
re-imports this file as its main module) gets it too. A request with ``max_tokens == 13`` fails
while its first token is taken; every other request runs normally.
"""

import sys

from omniwalk.models.qwen3_omni.thinker_program import ThinkerProgram

FAULT_MAX_TOKENS = 13
_commit = ThinkerProgram._commit


def _faulty_commit(req, pick):
    if req.state.thinker.max_tokens == FAULT_MAX_TOKENS:
        raise RuntimeError("injected engine fault")
    return _commit(req, pick)


ThinkerProgram._commit = staticmethod(_faulty_commit)

if __name__ == "__main__":
    from omniwalk.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
