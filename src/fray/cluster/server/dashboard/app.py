"""The dashboard's web application: log-in, pages, live streams, and the one action (stop a job).

Security, all in this module:

* every page and stream needs a session cookie; a session is made only by posting
  the cluster token to ``/login`` or by opening a one-time link (``fray dashboard``),
  whose code is good once and for five minutes;
* the cookie is ``HttpOnly`` and ``SameSite=Strict``; sessions live in memory for 12 h;
* nothing changes state on a GET: log-out and stop are POSTs carrying the session's
  CSRF token, and a POST whose ``Origin`` is another site is refused;
* pages forbid framing and inline scripts (a strict Content-Security-Policy) and send
  referrer to other sites, so a one-time code never leaks through a link.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from fray.cluster.server.dashboard import charts, pages, stacks, timeline

__all__ = ["Backend", "Sessions", "build_app"]

SESSION_COOKIE = "fray_session"
_SESSION_SECONDS = 12 * 3600
_CODE_SECONDS = 300
# How often live streams look for changes.
_STREAM_PERIOD = 0.5
_FINISHED = ("succeeded", "failed", "stopped")

_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


class Backend(Protocol):
    """What the dashboard reads and does: the operator API plus the controller's logs and terminate."""

    def jobs(
        self, states: list[str] | None = None, limit: int = 50, namespace: str | None = None, name: str | None = None
    ) -> list[dict[str, Any]]: ...
    def job_detail(self, job_id: str) -> dict[str, Any]: ...
    def status(self) -> dict[str, Any]: ...
    def queues(self) -> list[dict[str, Any]] | None: ...
    def logs(self, job_id: str, last: int | None = None, after_id: int = 0) -> list[tuple[int, str]]: ...
    def terminate(self, job_id: str) -> None: ...
    def utilisation(self, since: float = 0.0) -> dict[str, Any]: ...
    def job_stacks(self, job_id: str, timeout: float = 10.0, locals: bool = False) -> list[dict[str, Any]]: ...


@dataclass
class _Session:
    expires: float
    csrf: str


class Sessions:
    """Log-in state in memory: sessions by cookie, one-time codes by value. Thread-safe."""

    def __init__(self, token: bytes) -> None:
        self._token = token
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._codes: dict[str, float] = {}

    def check_token(self, offered: str) -> bool:
        """True if ``offered`` is the cluster token (compared in constant time)."""
        return hmac.compare_digest(offered.strip().encode(), self._token)

    def new_code(self) -> str:
        """A one-time log-in code, good for five minutes."""
        code = secrets.token_urlsafe(24)
        with self._lock:
            now = time.monotonic()
            self._codes = {c: t for c, t in self._codes.items() if t > now}
            self._codes[code] = now + _CODE_SECONDS
        return code

    def use_code(self, code: str) -> bool:
        """Consume ``code``: True the first time, within five minutes of its making."""
        with self._lock:
            expires = self._codes.pop(code, 0.0)
        return expires > time.monotonic()

    def open(self) -> str:
        """A new session; returns its cookie value."""
        key = secrets.token_urlsafe(32)
        with self._lock:
            now = time.monotonic()
            self._sessions = {k: s for k, s in self._sessions.items() if s.expires > now}
            self._sessions[key] = _Session(now + _SESSION_SECONDS, secrets.token_urlsafe(24))
        return key

    def get(self, key: str | None) -> _Session | None:
        """The live session with cookie value ``key``, if any."""
        if not key:
            return None
        with self._lock:
            session = self._sessions.get(key)
            if session is None or session.expires <= time.monotonic():
                self._sessions.pop(key, None)
                return None
            return session

    def close(self, key: str | None) -> None:
        """End the session ``key``."""
        with self._lock:
            self._sessions.pop(key or "", None)


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=_HEADERS)


def _local_path(path: str) -> str:
    """``path`` if it is a path on this site, else the jobs page (no open redirects)."""
    parts = urlsplit(path)
    if parts.scheme or parts.netloc or not path.startswith("/") or path.startswith("//"):
        return "/jobs"
    return path


def _signed_in(response: Response, sessions: Sessions, target: str) -> Response:
    response.set_cookie(
        SESSION_COOKIE, sessions.open(), max_age=_SESSION_SECONDS, httponly=True, samesite="strict", path="/"
    )
    return response


def build_app(backend: Backend, sessions: Sessions, *, stopping: threading.Event | None = None) -> Starlette:
    """The dashboard as an ASGI application."""
    stop_streams = stopping or threading.Event()

    async def form(request: Request) -> dict[str, str]:
        body = (await request.body()).decode(errors="replace")
        return {k: v[0] for k, v in parse_qs(body).items()}

    def same_origin(request: Request) -> bool:
        origin = request.headers.get("origin")
        return origin is None or urlsplit(origin).netloc == request.headers.get("host", "")

    Handler = Callable[[Request, _Session], Awaitable[Response]]

    def authed(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            session = sessions.get(request.cookies.get(SESSION_COOKIE))
            if session is None:
                if request.url.path.startswith(("/stream/", "/data/")):
                    return PlainTextResponse("log in first", status_code=401, headers=_HEADERS)
                return RedirectResponse(f"/login?next={request.url.path}", status_code=303, headers=_HEADERS)
            return await handler(request, session)

        return endpoint

    def posted(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def checked(request: Request, session: _Session) -> Response:
            fields = await form(request)
            if not same_origin(request) or not hmac.compare_digest(fields.get("csrf", ""), session.csrf):
                return PlainTextResponse("refused: cross-site request", status_code=403, headers=_HEADERS)
            return await handler(request, session)

        return authed(checked)

    async def login_form(request: Request) -> Response:
        code = request.query_params.get("code")
        if code is not None:
            if sessions.use_code(code):
                return _signed_in(RedirectResponse("/jobs", status_code=303, headers=_HEADERS), sessions, "/jobs")
            return _html(pages.login_page("That log-in link was used already or has expired."), 401)
        return _html(pages.login_page(next_path=_local_path(request.query_params.get("next", "/jobs"))))

    async def login(request: Request) -> Response:
        fields = await form(request)
        target = _local_path(fields.get("next", "/jobs"))
        if not same_origin(request) or not sessions.check_token(fields.get("token", "")):
            return _html(pages.login_page("That is not this cluster's token.", target), 401)
        return _signed_in(RedirectResponse(target, status_code=303, headers=_HEADERS), sessions, target)

    async def logout(request: Request, session: _Session) -> Response:
        sessions.close(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", status_code=303, headers=_HEADERS)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    async def home(request: Request, session: _Session) -> Response:
        return RedirectResponse("/jobs", status_code=303, headers=_HEADERS)

    def wanted_state(request: Request) -> str:
        state = request.query_params.get("state", "")
        return state if state in ("pending", "running", *_FINISHED) else ""

    async def jobs(request: Request, session: _Session) -> Response:
        state = wanted_state(request)
        rows = await run_in_threadpool(backend.jobs, [state] if state else None, 100)
        status = await run_in_threadpool(backend.status)
        return _html(pages.jobs_page(rows, status["jobs"], state, session.csrf))

    async def job(request: Request, session: _Session) -> Response:
        try:
            detail = await run_in_threadpool(backend.job_detail, request.path_params["job_id"])
        except KeyError:
            return _html(pages.page("No such job", "<h1>No such job</h1>", csrf=session.csrf), 404)
        return _html(pages.job_page(detail, session.csrf, timeline.timeline_svg(detail["tasks"], time.time())))

    async def logs(request: Request, session: _Session) -> Response:
        job_id = request.path_params["job_id"]
        try:
            detail = await run_in_threadpool(backend.job_detail, job_id)
        except KeyError:
            return _html(pages.page("No such job", "<h1>No such job</h1>", csrf=session.csrf), 404)
        lines = await run_in_threadpool(backend.logs, job_id, 500)
        return _html(pages.logs_page(job_id, [text for _, text in lines], detail["state"], session.csrf))

    async def stacks_data(request: Request, session: _Session) -> Response:
        # A read, like the pages: it asks the job's processes for their stacks and changes nothing.
        job_id = request.path_params["job_id"]
        try:
            detail = await run_in_threadpool(backend.job_detail, job_id)
        except KeyError:
            return JSONResponse({"text": f"no job {job_id}", "stacks": []}, status_code=404, headers=_HEADERS)
        with_locals = request.query_params.get("locals", "") in ("1", "true")
        found = await run_in_threadpool(backend.job_stacks, job_id, stacks.TIMEOUT, with_locals)
        return JSONResponse(stacks.stacks_data(found, detail["state"]), headers=_HEADERS)

    async def stop(request: Request, session: _Session) -> Response:
        job_id = request.path_params["job_id"]
        await run_in_threadpool(backend.terminate, job_id)
        return RedirectResponse(f"/jobs/{job_id}", status_code=303, headers=_HEADERS)

    async def workers(request: Request, session: _Session) -> Response:
        return _html(pages.workers_page(await run_in_threadpool(backend.status), session.csrf))

    async def actors(request: Request, session: _Session) -> Response:
        return _html(pages.actors_page(await run_in_threadpool(backend.status), session.csrf))

    async def utilisation(request: Request, session: _Session) -> Response:
        return _html(charts.utilisation_page(await run_in_threadpool(backend.utilisation), session.csrf))

    async def utilisation_data(request: Request, session: _Session) -> Response:
        data = charts.chart_data(await run_in_threadpool(backend.utilisation))
        return JSONResponse(data, headers=_HEADERS)

    async def queues(request: Request, session: _Session) -> Response:
        return _html(pages.queues_page(await run_in_threadpool(backend.queues), session.csrf))

    def event(data: str, name: str = "") -> str:
        head = f"event: {name}\n" if name else ""
        return head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"

    def sse(events: AsyncIterator[str]) -> StreamingResponse:
        headers = {**_HEADERS, "X-Accel-Buffering": "no"}
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)

    async def stream_jobs(request: Request, session: _Session) -> Response:
        state = wanted_state(request)

        async def events() -> AsyncIterator[str]:
            last = ""
            while not stop_streams.is_set() and not await request.is_disconnected():
                rows = await run_in_threadpool(backend.jobs, [state] if state else None, 100)
                html = pages.job_rows(rows)
                if html != last:
                    last = html
                    yield event(html)
                await asyncio.sleep(_STREAM_PERIOD)

        return sse(events())

    async def stream_logs(request: Request, session: _Session) -> Response:
        job_id = request.path_params["job_id"]

        async def events() -> AsyncIterator[str]:
            # The page shows the last 500 lines; the stream goes on from the newest of them.
            known = await run_in_threadpool(backend.logs, job_id, 1)
            after = known[-1][0] if known else 0
            while not stop_streams.is_set() and not await request.is_disconnected():
                detail = await run_in_threadpool(backend.job_detail, job_id)
                for line_id, text in await run_in_threadpool(backend.logs, job_id, None, after):
                    after = line_id
                    yield event(text)
                if detail["state"] in _FINISHED:
                    ended = f"{detail['state']} {detail['error']}".strip()
                    yield event(ended, "end")
                    return
                await asyncio.sleep(_STREAM_PERIOD)

        return sse(events())

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "app.js":
            return Response(pages.SCRIPT + stacks.SCRIPT, media_type="text/javascript", headers=_HEADERS)
        if name == "app.css":
            return Response(pages.STYLE + timeline.STYLE + stacks.STYLE, media_type="text/css", headers=_HEADERS)
        found = charts.static_file(name)
        if found is not None:
            return Response(found[0], media_type=found[1], headers=_HEADERS)
        return PlainTextResponse("not found", status_code=404, headers=_HEADERS)

    routes = [
        Route("/", authed(home)),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", posted(logout), methods=["POST"]),
        Route("/jobs", authed(jobs)),
        Route("/jobs/{job_id:path}", authed(job)),
        Route("/logs/{job_id:path}", authed(logs)),
        Route("/stop/{job_id:path}", posted(stop), methods=["POST"]),
        Route("/workers", authed(workers)),
        Route("/actors", authed(actors)),
        Route("/queues", authed(queues)),
        Route("/utilisation", authed(utilisation)),
        Route("/data/utilisation", authed(utilisation_data)),
        Route("/data/stacks/{job_id:path}", authed(stacks_data)),
        Route("/stream/jobs", authed(stream_jobs)),
        Route("/stream/logs/{job_id:path}", authed(stream_logs)),
        Route("/static/{name}", static),
    ]
    return Starlette(routes=routes)
