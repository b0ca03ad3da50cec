"""LoRA adapters over HTTP: POST /v1/load_lora_adapter {lora_name, lora_path} and /v1/unload_lora_adapter
{lora_name} (vLLM's routes, behind the API key), and the adapters' entries in /v1/models.

A load goes to every replica (rolled back on all if one refuses); its path, absolute or relative to
``ServerConfig.lora_root``, must lie inside that root once resolved (symbolic links followed): else 400,
as without a root. A bad adapter is a 400 naming the key at fault (``lora/adapters.py``); unloading one
not loaded is a 404 ``model_not_found``. An unloaded adapter's requests in flight finish with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from omniwalk.serve import schemas
from omniwalk.serve.engine_client import EngineRequestError
from omniwalk.serve.errors import APIError, bad_request

if TYPE_CHECKING:
    from omniwalk.serve.app import Served


class LoadLoraAdapter(schemas.Strict):
    lora_name: str
    lora_path: str


class UnloadLoraAdapter(schemas.Strict):
    lora_name: str


def add_adapter_routes(app: FastAPI, served: Served) -> None:
    """Run-time adapter loading (vLLM's routes): every replica loads or unloads it; a path must lie inside
    ``ServerConfig.lora_root`` once resolved (symbolic links followed), else 400."""

    @app.post("/v1/load_lora_adapter")
    async def load(request: Request):
        body = await served.body(request, LoadLoraAdapter, family_fields=False)
        path = _inside_root(served.cfg.lora_root, body.lora_path)
        if body.lora_name == served.context().model_name or body.lora_name in served.adapters:
            raise bad_request(f"the model {body.lora_name!r} is already served", "lora_name")
        try:
            await served.client.adapter_call("load", body.lora_name, str(path))
        except EngineRequestError as e:
            raise _adapter_error(e) from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request):
        body = await served.body(request, UnloadLoraAdapter, family_fields=False)
        if body.lora_name not in served.adapters:
            message = f"the adapter {body.lora_name!r} is not loaded"
            raise APIError(404, message, param="lora_name", code="model_not_found")
        try:
            await served.client.adapter_call("unload", body.lora_name)
        except EngineRequestError as e:
            raise _adapter_error(e) from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _inside_root(root: str | None, given: str) -> Path:
    """``given`` (absolute, or relative to ``root``) resolved, if it lies inside ``root``; else 400."""
    if not root:
        raise bad_request("this server loads no adapters at run time (it was started without --lora-root)", "lora_path")
    base = Path(root).resolve()
    path = (base / given).resolve()  # (an absolute ``given`` replaces the base)
    if not path.is_relative_to(base):
        raise bad_request(f"lora_path {given!r} is outside the server's adapter root", "lora_path")
    return path


def _adapter_error(e: EngineRequestError) -> APIError:
    if e.bad_request:
        return bad_request(str(e), e.param if e.param in ("lora_name", "lora_path") else "lora_path")
    return APIError(500, f"the adapter call failed in the engine: {e}", code="engine_error")


def adapter_entry(served: Served, name: str) -> dict:
    """An adapter in /v1/models: ``parent`` is the base model (as vLLM lists adapters)."""
    base = served.context().model_name
    return {"id": name, "object": "model", "created": 0, "owned_by": "omniwalk", "root": name, "parent": base}
