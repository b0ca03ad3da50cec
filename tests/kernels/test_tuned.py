"""Tuned launch configurations are data keyed by shape and GPU model (``omniwalk/kernels/tuned.py``,
``omniwalk/kernels/configs/*.json``): a GPU reads its own file, else one of its compute capability,
else the kernels' generic defaults, with one log line saying so (fake devices, on the CPU)."""

import json
import logging

import pytest

from omniwalk.kernels import skinny_gemm as sg
from omniwalk.kernels import tuned
from omniwalk.kernels.tuned import CONFIG_DIR, Device

H200 = Device("NVIDIA H200", (9, 0))
H100 = Device("NVIDIA H100 80GB HBM3", (9, 0))  # (no file of its own)
UNKNOWN = Device("NVIDIA Fake GPU", (8, 6))  # (no file of its compute capability either)
THINKER_QKV = (5120, 2048, False, False)  # (N, K, gated, may split)


@pytest.fixture(autouse=True)
def fresh_cache():
    tuned.configs.cache_clear()
    yield
    tuned.configs.cache_clear()


def test_the_shipped_files_are_keyed_by_device_and_shape():
    files = sorted(CONFIG_DIR.glob("*.json"))
    assert {f.name.split(",")[0] for f in files} >= {"skinny_gemm", "skinny_gemm_fp8", "paged_decode", "fused_moe"}
    for f in files:
        data = json.loads(f.read_text())
        assert f.name == tuned.file_name(f.name.split(",")[0], data["device_name"])
        assert len(data["compute_capability"]) == 2 and data["configs"] and data["written_by"]
    for kernel in ("skinny_gemm", "skinny_gemm_fp8"):
        for key, entry in tuned.configs(kernel, H200).items():
            assert key.startswith("rows=") and (entry == sg.CUBLAS or sg.Blocks(**entry))


def test_a_device_reads_its_own_tiles(caplog):
    with caplog.at_level(logging.WARNING, "omniwalk.kernels"):
        assert sg.pick_blocks(1, *THINKER_QKV, device=H200) is None  # ("cublas": cuBLAS measured faster)
        assert sg.pick_blocks(16, *THINKER_QKV, device=H200) == sg.Blocks(64, 128, 1, 4, 6)
        assert sg.pick_blocks(9, *THINKER_QKV, device=H200) == sg.Blocks(64, 128, 1, 4, 6)  # (rows padded to 16)
        assert sg.pick_blocks(1, *THINKER_QKV, fp8=True, device=H200) == sg.Blocks(16, 512, 1, 4, 1)  # FP8's own
    assert not caplog.records


def test_a_gpu_of_the_same_compute_capability_reads_that_file_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, "omniwalk.kernels"):
        assert tuned.configs("skinny_gemm", H100) == tuned.configs("skinny_gemm", H200)
        assert sg.pick_blocks(16, *THINKER_QKV, device=H100) == sg.Blocks(64, 128, 1, 4, 6)
        tuned.configs("skinny_gemm", H100)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "NVIDIA H100 80GB HBM3" in lines[0] and "NVIDIA H200" in lines[0]  # once


def test_an_unknown_device_gets_the_generic_defaults_and_one_log_line(caplog):
    with caplog.at_level(logging.WARNING, "omniwalk.kernels"):
        assert tuned.configs("skinny_gemm", UNKNOWN) == {}
        for m in (1, 16):  # the tuned tile (or cuBLAS) of an H200 is not taken: the defaults are
            assert sg.pick_blocks(m, *THINKER_QKV, device=UNKNOWN) == sg.default_blocks(m, 5120, 2048, False)
        tuned.configs("skinny_gemm", UNKNOWN)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "NVIDIA Fake GPU" in lines[0] and "generic defaults" in lines[0]


def test_other_kernels_fall_back_to_their_defaults(caplog):
    from omniwalk.kernels import fused_moe, grouped_fp8, moe_routing, paged_decode

    with caplog.at_level(logging.WARNING, "omniwalk.kernels"):
        assert paged_decode.decode_blocks(UNKNOWN) == paged_decode.DECODE_BLOCKS
        assert moe_routing.router_blocks(UNKNOWN) == moe_routing.ROUTER_BLOCKS
        assert fused_moe._blocks("down", None, UNKNOWN) == fused_moe.DOWN_BLOCKS
        assert grouped_fp8.grouped_blocks("gate_up", 64, UNKNOWN) == grouped_fp8.GATE_UP_BLOCKS[64]
    assert len(caplog.records) == 4
    assert paged_decode.decode_blocks(H200) == (64, 4)  # (the H200's file)


def test_the_cpu_reads_no_file_silently(caplog):
    with caplog.at_level(logging.WARNING, "omniwalk.kernels"):
        assert tuned.configs("skinny_gemm", tuned.CPU) == {}
        assert tuned.device_of("cpu") == tuned.CPU
    assert not caplog.records


def test_save_writes_the_file_the_loader_reads(tmp_path):
    first = {"rows=1,N=64,K=32,gated=0,may_split=0": sg.CUBLAS}
    path = tuned.save("skinny_gemm", UNKNOWN, first, "a test", directory=tmp_path)
    assert path.name == "skinny_gemm,device_name=NVIDIA_Fake_GPU.json"
    second = {"rows=16,N=64,K=32,gated=0,may_split=0": sg.Blocks(16, 32, 1, 4, 2)._asdict()}
    tuned.save("skinny_gemm", UNKNOWN, second, "a test", directory=tmp_path)  # (entries of other keys kept)
    assert tuned.configs("skinny_gemm", UNKNOWN, tmp_path) == first | second
    with pytest.raises(ValueError):
        tuned.save("skinny_gemm", tuned.CPU, first, "a test", directory=tmp_path)
