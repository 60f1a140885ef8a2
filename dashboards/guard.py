"""Requests the app refuses: a malformed callback gets a 4xx and a short line, never HTTP 500 with
a Flask traceback (issue #24).

Dash parses ``POST /_dash-update-component`` itself and trusts it: a body that is a JSON list, an
unknown output, fewer outputs than the callback has, ``inputs`` that is a number, a body nested
100,000 deep or 30 MB long each ended in a Python exception, answered with HTTP 500 and its
traceback logged on the server's stderr. Here, before Dash sees it, a callback request is
checked: at most MAX_BODY_BYTES (413 beyond), JSON nested at most MAX_DEPTH deep, an object
naming a callback of this app with as many outputs, inputs and states as that callback has
(400 otherwise, with the one problem). Anything that still raises in a request is answered
with a short status line, and one line on stderr: ``tracekit dash: <path>: <error>``.

The callbacks themselves are guarded too (dashboards.pages.common.guarded): what a callback
gets wrong shows on the page as one line.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from dash import Dash
from dash.exceptions import DependencyException
from flask import Response, request
from werkzeug.exceptions import HTTPException

MAX_BODY_BYTES = 1 << 20  # the app's callbacks send URLs, dropdown values and zoom ranges
MAX_DEPTH = 64
CALLBACK_PATH = "_dash-update-component"


class Malformed(Exception):
    """A callback request that is not one of this app's; str() is the one line answered."""


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether VALUE (decoded JSON) nests deeper than LIMIT, without recursion."""
    todo = [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if depth > limit:
            return True
        if isinstance(v, dict):
            todo.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            todo.extend((x, depth + 1) for x in v)
    return False


def _props(body: dict, key: str, required: bool) -> list:
    items = body.get(key, None if required else [])
    if not isinstance(items, list) or not all(
        isinstance(i, dict) and "id" in i and isinstance(i.get("property"), str) for i in items
    ):
        raise Malformed(f"{key!r} must be a list of {{id, property, value}} objects")
    return items


def check(app: Dash, raw: bytes) -> dict:
    """The callback request RAW decoded, or Malformed saying what is wrong with it."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise Malformed(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise Malformed(f"not JSON ({type(exc).__name__})") from None
    if _deeper_than(body, MAX_DEPTH):
        raise Malformed(f"JSON nested deeper than {MAX_DEPTH} levels")
    if not isinstance(body, dict):
        raise Malformed(f"a callback request is a JSON object, not {type(body).__name__}")
    output = body.get("output")
    if not isinstance(output, str) or output not in app.callback_map:
        raise Malformed("no such callback output")
    callback = app.callback_map[output]
    outputs = body.get("outputs")
    many = isinstance(callback["output"], list)
    n_out = len(callback["output"]) if many else 1
    if (many and not (isinstance(outputs, list) and len(outputs) == n_out)) or (
        not many and not isinstance(outputs, dict)
    ):
        raise Malformed(f"'outputs' does not match the callback's {n_out} output(s)")
    for key, need in (("inputs", len(callback["inputs"])), ("state", len(callback["state"]))):
        got = _props(body, key, required=key == "inputs")
        if len(got) != need:
            raise Malformed(f"{key!r}: {len(got)} given, the callback takes {need}")
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        raise Malformed("'changedPropIds' must be a list of strings")
    return body


def _line(code: int, text: str) -> Response:
    return Response(f"{code} {text}\n", status=code, mimetype="text/plain")


def install(app: Dash) -> None:
    """Check every callback request before Dash runs it; answer every error in a line."""
    server = app.server
    server.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES

    @server.before_request
    def _check_callback() -> Response | None:
        if request.method != "POST" or not request.path.endswith("/" + CALLBACK_PATH):
            return None
        try:
            check(app, request.get_data(cache=True))
        except Malformed as exc:
            return _line(400, f"malformed callback request: {exc}")
        return None

    @server.errorhandler(Exception)
    def _one_line(error: Exception) -> Response:
        if isinstance(error, HTTPException):  # 404, 405, 413, 415...: its name, no page
            return _line(error.code or 500, error.name)
        if isinstance(error, DependencyException):  # /_dash-component-suites/<unknown>/...
            return _line(404, "Not Found")
        line = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        print(f"tracekit dash: {request.path}: {line}", file=sys.stderr)
        if request.path.endswith("/" + CALLBACK_PATH):
            return _line(400, "malformed callback request")
        return _line(500, "internal error (one line on the server's stderr)")
