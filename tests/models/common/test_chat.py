"""Where a checkpoint's chat template is read from: the files transformers reads, in its order
(``AutoProcessor``: processor_config.json, chat_template.json, chat_template.jinja; ``AutoTokenizer``:
chat_template.jinja, then tokenizer_config.json).

Tools in the chat prompt: our rendering + tokenisation equals HF's ``apply_chat_template(messages,
tools=...)`` on both families' tiny checkpoints, the template lays tools out as the published Qwen3
template does, and malformed tool calls / results are typed 400s naming the field."""

import copy
import json
import re
import shutil

import pytest
from transformers import AutoTokenizer, ProcessorMixin

from omniwalk.errors import CheckpointError, InvalidRequestError
from omniwalk.models.common.processing.chat import ChatProcessor
from omniwalk.models.qwen2_5_omni.checkpoint import tiny as tiny25
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen3_omni.checkpoint import tiny as tiny3
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
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


FAMILIES = {"qwen3_omni": (tiny3, Qwen3OmniConfig), "qwen2_5_omni": (tiny25, Qwen25OmniConfig)}
SYSTEM = "Default system prompt."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Today's weather in a city (°C).",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]
CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
]
HISTORY = [
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": CALLS},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    {"role": "assistant", "content": "Let me check again.", "tool_calls": CALLS[:1]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22"},
    {"role": "assistant", "content": "21 °C at noon."},
    {"role": "user", "content": "Thanks! And tomorrow?"},
]
CASES = {  # name -> (messages, tools)
    "tools_user": ([{"role": "user", "content": "Weather in Paris?"}], TOOLS),
    "tools_system": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}], TOOLS),
    "tools_history": (HISTORY, TOOLS),
    "history_empty_content": ([{**m, "content": ""} if m.get("content") is None else m for m in HISTORY], TOOLS),
    "no_tools": (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What is this?"}]},
            {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "And this?"}]},
        ],
        None,
    ),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    tiny, config = FAMILIES[request.param]
    ckpt = tiny.make_tiny_checkpoint(tmp_path_factory.mktemp(request.param), with_weights=False)
    processor = ChatProcessor(config.from_hf(ckpt), Tokenizer.from_dir(ckpt), SYSTEM)
    return tiny, processor, AutoTokenizer.from_pretrained(ckpt)


def hf_ids(hf, messages, tools) -> list[int]:
    return hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)


@pytest.mark.parametrize("case", list(CASES))
def test_prompt_ids_equal_hf_apply_chat_template(family, case):
    _, processor, hf = family
    messages, tools = CASES[case]
    ids, media = processor.tokenize(messages, use_default_system_prompt=False, tools=tools)
    assert ids == hf_ids(hf, messages, tools)
    assert len(media) == (2 if case == "no_tools" else 0)


def test_default_system_prompt_carries_the_tools_block(family):
    _, processor, hf = family
    messages, tools = CASES["tools_user"]
    ids, _ = processor.tokenize(messages, tools=tools)
    assert ids == hf_ids(hf, [{"role": "system", "content": SYSTEM}, *messages], tools)


def test_empty_tools_render_as_no_tools(family):
    _, processor, _ = family
    messages, _ = CASES["tools_user"]
    assert processor.tokenize(messages, tools=[]) == processor.tokenize(messages)


def test_rendering_is_the_published_qwen3_tools_layout(family):
    """The text the published Qwen3 template renders for tools, a system prompt, a call and its result."""
    _, processor, hf = family
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": CALLS[:1]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21"},
    ]
    expected = (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}'
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        '<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n21\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids, _ = processor.tokenize(messages, tools=[TIME])
    assert processor.tokenizer.decode(ids, skip_special_tokens=False) == expected
    assert hf.apply_chat_template(messages, tools=[TIME], add_generation_prompt=True, tokenize=False) == expected


def test_tool_tokens_are_added_tokens_kept_as_text(family):
    tiny, processor, hf = family
    tok = processor.tokenizer
    assert {"<tool_call>": 151657, "</tool_call>": 151658}.items() <= tiny.TEXT_TOKENS.items()
    for name, token_id in tiny.TEXT_TOKENS.items():
        assert tok.encode(name) == [token_id]
        assert tok.decode([token_id], skip_special_tokens=True) == name
        assert hf.decode([token_id], skip_special_tokens=True) == name
    im_end = tok.token_to_id("<|im_end|>")
    ids = tok.encode('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>') + [im_end]
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids) == '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def test_qwen3_vocabulary_has_the_tool_response_and_think_tokens():
    assert tiny3.TEXT_TOKENS == {
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    }


def test_template_without_tools_support_refuses_tools(family):
    _, processor, _ = family
    assert processor.supports_tools
    plain = copy.copy(processor.tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    without = ChatProcessor(processor.cfg, plain, None)
    assert not without.supports_tools
    assert without.tokenize([{"role": "user", "content": "hi"}])[0] == plain.encode("hi")
    with pytest.raises(InvalidRequestError, match="does not support tools") as e:
        without.tokenize([{"role": "user", "content": "hi"}], tools=TOOLS)
    assert e.value.param == "tools"


def _assistant(tool_calls):
    return {"role": "assistant", "content": None, "tool_calls": tool_calls}


BAD = {  # message -> the field named
    "calls_not_a_list": (_assistant({"id": "c"}), "messages[1].tool_calls"),
    "call_not_an_object": (_assistant(["call"]), "messages[1].tool_calls[0]"),
    "no_id": (_assistant([{"type": "function", "function": CALLS[0]["function"]}]), "messages[1].tool_calls[0].id"),
    "bad_type": (_assistant([{**CALLS[0], "type": "code"}]), "messages[1].tool_calls[0].type"),
    "no_function": (_assistant([{"id": "c", "type": "function"}]), "messages[1].tool_calls[0].function"),
    "empty_name": (
        _assistant([{"id": "c", "function": {"name": "", "arguments": "{}"}}]),
        "messages[1].tool_calls[0].function.name",
    ),
    "arguments_object": (
        _assistant([CALLS[0], {"id": "c", "function": {"name": "f", "arguments": {"x": 1}}}]),
        "messages[1].tool_calls[1].function.arguments",
    ),
    "calls_on_user": ({"role": "user", "content": "hi", "tool_calls": CALLS}, "messages[1].tool_calls"),
    "tool_without_id": ({"role": "tool", "content": "21"}, "messages[1].tool_call_id"),
    "tool_content_list": (
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "21"}]},
        "messages[1].content",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_tool_messages_are_invalid_requests(family, case):
    _, processor, _ = family
    message, field = BAD[case]
    with pytest.raises(InvalidRequestError, match="^" + re.escape(field + " ")) as e:
        processor.tokenize([{"role": "user", "content": "hi"}, message], tools=TOOLS)
    assert e.value.param == field
