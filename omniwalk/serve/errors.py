"""OpenAI-shaped error responses: ``{"error": {"message", "type", "param", "code"}}``.

Every failure the server answers goes through ``APIError`` (or one of the handlers below, which
turn framework errors into one): ``param`` names the body field at fault (``messages[0].content``)
and ``code`` is a short string (``invalid_value``, ``unsupported_parameter``, ...) or None.
Messages never carry internals (object reprs, errno numbers, upstream statuses).
"""

from __future__ import annotations

from pydantic import ValidationError
from starlette.responses import JSONResponse

# pydantic error type -> OpenAI-style code
_CODES = {
    "missing": "missing_required_parameter",
    "extra_forbidden": "unknown_parameter",
    "json_invalid": "invalid_json",
    "recursion_loop": "invalid_json",
    "union_tag_invalid": "invalid_value",
    "union_tag_not_found": "missing_required_parameter",
}
_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None, headers=None):
        super().__init__(message)
        self.status, self.param, self.code, self.headers = status, param, code, headers

    @property
    def kind(self) -> str:
        return _KINDS.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def unsupported(param: str, what: str) -> APIError:
    return APIError(400, f"{what} is not supported by this server", param=param, code="unsupported_parameter")


def field_path(loc: tuple) -> str | None:
    """('messages', 0, 'content', 1, 'input_audio', 'data') -> 'messages[0].content[1].input_audio.data'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return out or None


# the discriminated unions' list fields -> their tags (pydantic puts the tag right after the list index:
# ('messages', 0, 'user', 'content', 1, 'input_audio', 'input_audio', 'data'); a union tagged by a
# callable puts a branch label there instead, and the next part is a field: ('content', 0, 'InputAudio',
# 'input_audio', 'data'))
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
_TAGGED = {"messages": _ROLES, "content": {"text", "input_audio", "image_url", "audio_url", "video_url"}}
_BRANCHES = {"str", "int", "float", "bool", "none", "dict", "list"}


def _is_branch_label(part) -> bool:
    return isinstance(part, str) and (part in _BRANCHES or part[:1].isupper() or "[" in part or "-" in part)


def _field_loc(loc: tuple) -> tuple:
    """A pydantic location without union branch labels ('str', 'list[...]', 'URLRef') and tags (a
    tag is the part right after a list index, in the list of a tagged union)."""
    out = []
    for i, part in enumerate(loc):
        if _is_branch_label(part):
            continue
        is_tag = i and isinstance(loc[i - 1], int) and len(out) >= 2 and part in _TAGGED.get(out[-2], ())
        if not is_tag:
            out.append(part)
    return tuple(out)


def validation_error(e: ValidationError) -> APIError:
    """The first failure of a body -> 400 naming the field."""
    # A union's branches each report a failure: the deepest one is the one the caller meant
    # (a list of parts with a bad part, not "content should be a string").
    error = max(e.errors(include_url=False), key=lambda err: len(_field_loc(tuple(err["loc"]))))
    loc, kind = _field_loc(tuple(error["loc"])), error["type"]
    param = field_path(loc)
    code = _CODES.get(kind, "invalid_type" if kind.endswith("_type") else "invalid_value")
    if kind == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {error['msg'].removeprefix('Invalid JSON: ')}", code=code)
    if kind == "model_type" and not loc:
        return APIError(400, "the request body must be a JSON object", code="invalid_type")
    if kind == "extra_forbidden":
        return APIError(400, f"unrecognized request argument: {param}", param=param, code=code)
    if kind == "union_tag_invalid":
        tag = error["ctx"]["tag"]
        what = "role" if "role" in error["ctx"]["discriminator"] else "content type"
        expected = error["ctx"]["expected_tags"]
        return APIError(400, f"unknown {what} {tag!r}; expected one of {expected}", param=param, code=code)
    return APIError(400, f"{param or 'body'}: {error['msg']}", param=param, code=code)
