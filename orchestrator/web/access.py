"""Who may read the dashboard, and who may act through it.

- Bound to a loopback address, the dashboard answers only requests whose Host header names
  that loopback address or `localhost` (a web page elsewhere cannot reach it through a DNS name
  that points at 127.0.0.1), and needs no token.
- Bound to any other address, every request but `/healthz` needs the token: the header
  `Authorization: Bearer TOKEN`, or the cookie a first visit with `?token=TOKEN` sets
  (HttpOnly, SameSite=Strict; the visit is redirected to the same page without the token in
  its address). The token is made once and kept, readable by its owner alone, at
  `ORCH_HOME/dashboard-token` (`load_token`).
- Cancel and down exist only when the dashboard is started with `--allow-actions`, and then
  only as POST forms that carry this process's CSRF token and come from the dashboard's own
  origin.

Nothing here trusts the client: tokens are compared in constant time, and a refused request
learns nothing about the ledger.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.atomic import write_atomic
from orchestrator.errors import ConfigError

TOKEN_FILE = "dashboard-token"
COOKIE = "orch_dashboard"
OPEN_PATHS = frozenset({"/healthz"})  # answered to anyone: a readiness probe, no ledger data
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def is_loopback(address: str) -> bool:
    """Whether `address` (an IP literal or `localhost`) reaches this machine only."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def load_token(home: Path, *, renew: bool = False) -> str:
    """The dashboard's token at `home`/dashboard-token, made (0600, atomically) when there is
    none, when `renew`, or when the file is not a token or is readable by others (a token
    others could read is no secret: it is replaced). Raises ConfigError when it cannot be
    written."""
    path = home / TOKEN_FILE
    if not renew:
        try:
            mode = path.lstat().st_mode
            text = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            text, mode = "", 0
        private = stat.S_ISREG(mode) and not mode & (stat.S_IRWXG | stat.S_IRWXO)
        if private and len(text) >= 32 and set(text) <= _TOKEN_CHARS:
            return text
    token = secrets.token_urlsafe(32)
    try:
        home.mkdir(parents=True, exist_ok=True)
        write_atomic(path, token + "\n", private=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the dashboard's token to {path}: {exc.strerror or exc}",
            hint="check that ORCH_HOME is writable by you",
        ) from exc
    return token


def same(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a secret the client sent."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


@dataclass(frozen=True)
class Access:
    """The dashboard's rules for one server: its port, whether it needs `token` (None: a
    loopback bind, no token), and the CSRF token of its forms."""

    bind: str
    port: int
    token: str | None
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def allowed_host(self, host_header: str) -> bool:
        """A loopback dashboard answers only Host headers naming a loopback address or
        `localhost` (with its port); a token-guarded one answers any name it is reached by."""
        if self.token is not None:
            return True
        host = urlsplit(f"//{host_header}").hostname or ""
        return is_loopback(host)

    def authorized(self, request: Request) -> bool:
        if self.token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and same(value.strip(), self.token):
            return True
        return same(request.cookies.get(COOKIE), self.token)

    def same_origin(self, request: Request) -> bool:
        """A form's POST came from a page of this dashboard: its Origin (or, without one, its
        Referer) names the host the request was sent to."""
        origin = request.headers.get("origin") or request.headers.get("referer")
        if not origin:
            return False
        return urlsplit(origin).netloc == request.headers.get("host", "")


def url_without_token(url: URL) -> str:
    kept = [(k, v) for k, v in parse_qsl(url.query, keep_blank_values=True) if k != "token"]
    path = "/" + url.path.lstrip("/")  # never `//host/...`, which a browser reads as another site
    return path + (f"?{urlencode(kept)}" if kept else "")


class AccessMiddleware:
    """Applies `Access` to every HTTP request before the app sees it."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self._refusal(request)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def _refusal(self, request: Request) -> Response | None:
        access = self.access
        if not access.allowed_host(request.headers.get("host", "")):
            return PlainTextResponse(
                "This dashboard answers only at the address it printed "
                "(http://127.0.0.1:PORT/ or http://localhost:PORT/).",
                status_code=421,
            )
        if request.url.path in OPEN_PATHS or access.token is None:
            return None
        given = request.query_params.get("token")
        if given is not None and request.method == "GET" and same(given, access.token):
            response = RedirectResponse(url_without_token(request.url), status_code=303)
            response.set_cookie(COOKIE, access.token, httponly=True, samesite="strict", path="/")
            return response
        if access.authorized(request):
            return None
        return PlainTextResponse(
            "This dashboard needs its token: open the address `orch dashboard` printed "
            "(it ends in ?token=...), or send `Authorization: Bearer TOKEN`. The token is "
            "in ORCH_HOME/dashboard-token on the machine that serves it.",
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
