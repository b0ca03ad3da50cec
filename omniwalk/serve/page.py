"""The talk page: ``GET /`` (plain HTML + JS, no build step) and its scripts under ``/static/``.

The page (``static/``) opens ``/v1/realtime``, captures the microphone in an AudioWorklet as
PCM16 at 24 kHz, plays the answer as it streams and shows both transcripts.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse

from omniwalk.serve.errors import APIError

STATIC = Path(__file__).parent / "static"
FILES = {"talk.js": "text/javascript", "mic-worklet.js": "text/javascript", "talk.css": "text/css"}


def add_page_routes(app: FastAPI) -> None:
    @app.get("/")
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/static/{name}")
    async def static(name: str):
        if name not in FILES:
            raise APIError(404, f"no route /static/{name}", code="not_found")
        return FileResponse(STATIC / name, media_type=FILES[name])
