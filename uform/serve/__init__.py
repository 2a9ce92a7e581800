"""``uform serve``: an OpenAI-compatible HTTP server for every modality a checkpoint holds.

Installed with the ``uform[serve]`` extra (uvicorn, prometheus_client, orjson); nothing
here is imported by ``import uform``. One module per job:

- ``config``: :class:`ServeConfig`, every limit and budget the server enforces
- ``errors``: :class:`ApiError` and OpenAI's error shape
- ``parts``: content parts (``image_url``, ``input_audio``, ``video_url``) to file bytes
- ``requests``: request bodies to items, checked, each error naming its item
- ``lane``: one verb's queue and the worker that coalesces it into one call per batch
- ``batcher``: the lanes together, admission (bounded queue) and draining
- ``respond``: rows to OpenAI's response (float or base64, ``dimensions``)
- ``metrics``: the Prometheus metrics
- ``asgi``: the ASGI application: lifespan, routing, API key, body limits, request metrics
- ``routes``: the routes' handlers and what they share
- ``guard``: the request heads' limits and the drain's deadline, in front of uvicorn's protocol
- ``run``: loading the model and running it on uvicorn with SIGTERM drain

docs/serve.md documents every route, field, limit, status and header.
"""

from __future__ import annotations

from .config import ServeConfig

__all__ = ["ServeConfig"]
