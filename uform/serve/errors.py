"""Errors answered to clients, in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from typing import Any

import orjson

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}  # fmt: skip


class ApiError(Exception):
    """A request the server refuses: ``status``, a ``message`` naming the item and reason,
    the request field at fault (``param``) and a short ``code``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def encoded(self) -> bytes:
        try:
            return orjson.dumps(self.body())
        except TypeError:  # a lone surrogate in the message: JSON's own escape for it, never a failed answer
            return json.dumps(self.body()).encode()


def shown(value: Any, limit: int = 80) -> str:
    """A request's value in a message: a scalar's repr (cut at ``limit`` characters), a
    container's type name (a list nested 100,000 deep has no repr to give)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value) if not isinstance(value, int) or value.bit_length() < 256 else "a huge integer"
        return text if len(text) <= limit else text[: limit - 3] + "..."
    return f"a {type(value).__name__}"


def bad_item(index: int, reason: str, *, param: str = "input", code: str = "invalid_item") -> ApiError:
    """The 400 for one bad item: names its index and the reason."""
    return ApiError(400, f"{param}[{index}]: {reason}", param=f"{param}[{index}]", code=code)
