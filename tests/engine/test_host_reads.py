"""CPU-side guard for the step loop's host reads (the GPU machine counts real synchronisations in
``test_sync_gpu.py``; this one runs in CI).

Every ``tolist`` / ``item`` / ``cpu`` / ``numpy`` call that omniwalk code makes while the engine
steps a mixed workload (all media kinds arriving, text and speech out) must come from an allowed
place: the step's read of sampled ids, or a reference backend (the CPU oracles; on CUDA the
fast backends replace them). (The talker's frames and the vocoder's audio come back through
``device.HostCopy``, an asynchronous copy waited for in the stage's ``finish``, not through these
methods.) A new read elsewhere, e.g. a ``.tolist()`` of a device tensor in a stage, fails here
before it costs a GPU synchronisation.
"""

import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers.qwen3_omni import checkpoint, make_request

import omniwalk
from omniwalk import Omni

PACKAGE = str(Path(omniwalk.__file__).parent) + "/"  # (a checkout may itself be named omniwalk)

ALLOWED = {
    ("sampling.py", "picks"),  # the thinker's one read of sampled ids (and logprobs)
    ("layers/moe.py", "reference_experts"),  # reference backends: CPU only
    ("layers/kv_attention.py", "paged_decode_reference"),
    ("layers/attention.py", "reference_attention"),
    # the prompt's positions, a host tensor the processor made (digested into the prefix pages' keys at add)
    ("models/common/programs/thinker_program.py", "prefix_keys"),
}
READS = ("tolist", "item", "cpu", "numpy")


@pytest.fixture
def record_reads(monkeypatch):
    sites = Counter()

    def wrap(name):
        original = getattr(torch.Tensor, name)

        def recorded(self, *args, **kwargs):
            ours = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(PACKAGE)]
            if ours:
                sites[(ours[-1].filename.removeprefix(PACKAGE), ours[-1].name)] += 1
            return original(self, *args, **kwargs)

        return recorded

    def start():
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, wrap(name))

    return sites, start


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_step_loop_reads_back_only_through_allowed_places(record_reads):
    sites, start = record_reads
    o = Omni(model=checkpoint("tiny"))
    requests = [make_request(i, path) for i, path in enumerate(["s2s", "i2t", "t2s", "s2t", "si2s", "v2t", "v2s"])]
    reqs = [o.add(r) for r in requests[:2]]
    o.engine.step()
    start()  # from here on: requests arriving with every media kind, prefills, decodes, speech
    for r in requests[2:]:
        reqs.append(o.add(r))
        o.engine.step()
    while o.engine.has_unfinished():
        o.engine.step()
    assert all(r.error is None for r in reqs)
    unexpected = {site: n for site, n in sites.items() if site not in ALLOWED}
    assert not unexpected, f"host reads outside the allowed places: {unexpected}"
    assert sites[("sampling.py", "picks")] > 0
