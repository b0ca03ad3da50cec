"""The field an error names (``errors.validation_error``), which realtime's partial ``session.update``
drops and reports: union branch labels and tags are left out of ``param``, a real field named like a
tag is kept (a Responses ``input_audio`` part's ``input_audio``), and a session's invalid fields are
each refused alone."""

import json

import pytest
from pydantic import ValidationError

from omniwalk.serve import responses_schemas as rs
from omniwalk.serve import schemas as s
from omniwalk.serve.errors import APIError, validation_error
from omniwalk.serve.realtime import protocol as p

AUDIO = {"type": "input_audio", "input_audio": {"data": 5, "format": "wav"}}


def param_of(model, body: dict) -> str:
    with pytest.raises(ValidationError) as e:
        model.model_validate_json(json.dumps(body))
    return validation_error(e.value).param


@pytest.mark.parametrize(
    ("model", "body", "param"),
    [
        (s.ChatRequest, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, AUDIO]}]},
         "messages[0].content[1].input_audio.data"),
        (s.ChatRequest, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
         "messages[0].content[0].text"),
        (rs.ResponsesRequest, {"input": [{"role": "user", "content": [AUDIO]}]},
         "input[0].content[0].input_audio.data"),
        (rs.ResponsesRequest, {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
         "input[0].content[0].text"),
    ],
)  # fmt: skip
def test_a_param_names_the_field_without_tags_or_branches(model, body, param):
    assert param_of(model, {"model": "m", **body}) == param


def test_a_session_update_keeps_its_valid_fields():
    session = {
        "instructions": "hi",
        "temperature": "hot",
        "tools": [{"type": "mcp"}],
        "audio": {"input": {"turn_detection": {"type": "fancy"}}, "output": {"voice": 5, "speed": 1.0}},
        "max_output_tokens": 7,
    }
    event = p.parse(json.dumps({"type": "session.update", "session": session}))
    assert event.session.instructions == "hi" and event.session.max_output_tokens == 7
    assert event.session.audio.output.speed == 1.0 and event.session.audio.input.turn_detection is None
    assert sorted(e.param for e in event.refused) == [
        "session.audio.input.turn_detection.type",  # (once, though its object is dropped after)
        "session.audio.output.voice",
        "session.temperature",
        "session.tools[0].type",
    ]
    with pytest.raises(APIError) as e:  # not an object: nothing to keep
        p.parse(json.dumps({"type": "session.update", "session": 5}))
    assert e.value.param == "session"
