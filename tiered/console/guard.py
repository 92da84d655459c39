"""The console's door, around the whole app: only GET and HEAD (anything else 405, before any
route), and never anonymous: HTTP Basic, user ``operator``, the password the operator secret,
compared in constant time; anything else 401 with ``WWW-Authenticate``. Only ``HEALTH``
answers without it, and it says nothing but that the console runs. The secret lives in a
0600 file, made with a random token when missing (the caller prints it)."""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from pathlib import Path

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from serving.config.tokens import read_secret, write_secret

USER = "operator"
HEALTH = "/console/healthz"
METHODS = (b"GET", b"HEAD")
REALM = 'Basic realm="Tiered fleet console", charset="UTF-8"'
# every answer: not cached, not framed, nothing loaded from elsewhere (the page has no script)
HEADERS = [(b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff"),
           (b"x-frame-options", b"DENY"), (b"referrer-policy", b"no-referrer"),
           (b"content-security-policy",
            b"default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'")]


def credential(path: Path) -> tuple[str, bool]:
    """The operator secret in ``path`` and whether it was just made (mode 0600)."""
    if path.exists():
        return read_secret(path, "console credential"), False
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(24)
    write_secret(path, f"{secret}\n".encode())
    return secret, True


def authorized(header: bytes | None, secret: str) -> bool:
    """Whether an ``Authorization`` header carries ``operator`` and ``secret``."""
    if not header or header[:6].lower() != b"basic ":
        return False
    try:
        user, _, password = base64.b64decode(header[6:].strip(), validate=True).partition(b":")
    except (binascii.Error, ValueError):
        return False
    # both compared, always: the time says nothing about which was wrong
    right_user = hmac.compare_digest(user, USER.encode())
    return hmac.compare_digest(password, secret.encode()) and right_user


class Door:
    """ASGI middleware: the method and the credential checked before the app sees a request;
    the security headers added to every answer."""

    def __init__(self, app: ASGIApp, secret: str) -> None:
        self.app = app
        self.secret = secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["path"] != HEALTH and not authorized(headers.get(b"authorization"), self.secret):
            await _refuse(send, 401, b"operator credential required",
                          [(b"www-authenticate", REALM.encode())])
            return
        if scope["method"].encode() not in METHODS:  # type: ignore[typeddict-item]
            await _refuse(send, 405, b"the console is read-only: GET and HEAD only",
                          [(b"allow", b"GET, HEAD")])
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, secured)


async def _refuse(send: Send, status: int, text: bytes,
                  extra: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(text) + 1).encode()), *extra,
                            *HEADERS]})
    await send({"type": "http.response.body", "body": text + b"\n", "more_body": False})
