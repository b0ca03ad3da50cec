"""The examples/ scripts run against a live server, as a user would run them."""

import subprocess
import sys
from pathlib import Path

import soundfile
from helpers.live_server import server

EXAMPLES = Path(__file__).parents[1] / "examples"


def run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_examples_against_a_live_server(tmp_path):
    with server() as base:
        assert "completion_tokens" in run(
            [sys.executable, str(EXAMPLES / "chat.py"), "--base-url", f"{base}/v1"], tmp_path
        )
        out = run([sys.executable, str(EXAMPLES / "speech_to_speech.py"), "--base-url", f"{base}/v1"], tmp_path)
        assert "speech: answer.wav" in out and soundfile.info(tmp_path / "answer.wav").samplerate == 24000
        out = run([sys.executable, str(EXAMPLES / "stream_speech.py"), "--base-url", f"{base}/v1"], tmp_path)
        assert "chunks" in out and soundfile.info(tmp_path / "stream.wav").duration > 0
        out = run([sys.executable, str(EXAMPLES / "realtime_talk.py"), "--base-url", f"{base}/v1"], tmp_path)
        assert "speech: answer.wav" in out and soundfile.info(tmp_path / "answer.wav").duration > 0
        out = run(["bash", str(EXAMPLES / "curl_chat.sh"), base], tmp_path)
        assert '"chat.completion"' in out and soundfile.info(tmp_path / "speech.wav").samplerate == 24000
