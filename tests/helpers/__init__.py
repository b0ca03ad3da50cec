"""Shared test code, imported as ``helpers.<module>`` (pyproject puts tests/ on the path): HF oracles and
reference implementations, make-tiny checkpoints and ``Omni`` instances per family, request sets and
workloads, the toy LM and its family, the live-server launcher and fault server, and scripts the tests
run in subprocesses (``tp_rank``, ``fault_server``). No test module is imported by another."""
