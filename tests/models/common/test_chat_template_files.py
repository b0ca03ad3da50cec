"""Where a checkpoint's chat template is read from: the files transformers reads, in its order
(``AutoProcessor``: processor_config.json, chat_template.json, chat_template.jinja; ``AutoTokenizer``:
chat_template.jinja, then tokenizer_config.json)."""

import json
import shutil

import pytest
from transformers import AutoTokenizer, ProcessorMixin

from omniwalk.errors import CheckpointError
from omniwalk.models.common.processing.chat import ChatProcessor
from omniwalk.models.qwen3_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.tokenizer import Tokenizer

FILES = {  # file -> how it holds the template
    "processor_config.json": lambda t: json.dumps({"chat_template": t}),
    "chat_template.json": lambda t: json.dumps({"chat_template": t}),
    "chat_template.jinja": lambda t: t,
    "tokenizer_config.json": lambda t: json.dumps({"tokenizer_class": "Qwen2Tokenizer", "chat_template": t}),
}


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), with_weights=False) / "tokenizer.json"


def checkpoint(tmp_path, tokenizer_json, files) -> tuple:
    """A checkpoint dir holding ``files``, each with a template that names its file."""
    shutil.copy(tokenizer_json, tmp_path / "tokenizer.json")
    for name in files:
        (tmp_path / name).write_text(FILES[name](f"from {name}{{{{ messages[0]['content'] }}}}"))
    return tmp_path, Tokenizer.from_dir(tmp_path).chat_template


@pytest.mark.parametrize(
    "files",
    [
        ["chat_template.jinja", "tokenizer_config.json"],
        ["tokenizer_config.json"],
    ],
)
def test_tokenizer_files_as_auto_tokenizer_reads_them(tmp_path, tokenizer_json, files):
    ckpt, ours = checkpoint(tmp_path, tokenizer_json, files)
    assert ours == AutoTokenizer.from_pretrained(ckpt).chat_template
    assert ours.startswith(f"from {files[0]}")


@pytest.mark.parametrize(
    "files",
    [
        ["processor_config.json", "chat_template.json", "chat_template.jinja", "tokenizer_config.json"],
        ["chat_template.json", "chat_template.jinja", "tokenizer_config.json"],
        ["chat_template.json", "tokenizer_config.json"],
        ["chat_template.jinja"],
    ],
)
def test_processor_files_as_auto_processor_reads_them(tmp_path, tokenizer_json, files):
    ckpt, ours = checkpoint(tmp_path, tokenizer_json, files)
    assert ours == ProcessorMixin.get_processor_dict(str(ckpt))[0]["chat_template"]
    assert ours.startswith(f"from {files[0]}")


def test_no_template_and_named_templates_are_checkpoint_errors(tmp_path, tokenizer_json):
    ckpt, ours = checkpoint(tmp_path, tokenizer_json, [])
    assert ours is None
    with pytest.raises(CheckpointError, match="no chat template"):
        ChatProcessor(None, Tokenizer.from_dir(ckpt), None)
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "default", "template": "x"}]}))
    with pytest.raises(CheckpointError, match="named templates"):
        Tokenizer.from_dir(ckpt)
