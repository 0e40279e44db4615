"""JSON over HTTP with urllib: one request, its answer decoded, an error
answer (or none) turned into the exception of its status."""

import http.client
import json
import logging
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import IO, Any, Optional

from .errors import ComposerError, Unavailable, error_for_status

__all__ = ["NAMESPACE_HEADER", "Transport", "check_namespace"]

log = logging.getLogger("composer_client.http")

_NO_BODY = object()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The API never redirects: a redirect is answered as the error it is,
    and the token is never sent on to wherever it points."""

    def redirect_request(  # noqa: PLR0917 - urllib's signature
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> Optional[urllib.request.Request]:
        return None


def _retry_after(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: not worth parsing here


def _error_of(status: int, reason: str, body: bytes, retry_after: Optional[str]) -> ComposerError:
    """The exception of an error answer: its ``{"error": {"code", "message"}}``,
    or, for an answer that is not the API's (a proxy's page), its reason."""
    code, message = "http_error", reason or f"HTTP {status}"
    try:
        detail = json.loads(body)["error"]
        if isinstance(detail.get("code"), str) and isinstance(detail.get("message"), str):
            code, message = detail["code"], detail["message"]
    except (ValueError, KeyError, TypeError, AttributeError):
        text = body[:200].decode("utf-8", "replace").strip()
        if text:
            message = f"{message}: {text}"
    return error_for_status(status, code, message, _retry_after(retry_after))


VERSION_HEADER = "composer-version"
"""Every answer of a Composer coordinator names its version in this header."""

NAMESPACE_HEADER = "composer-namespace"
"""The header naming the namespace a request is in (``default`` without it)."""

_NAMESPACE = re.compile(r"[a-z][a-z0-9-]{0,62}")
"""What a namespace's name may be: the API's ``^[a-z][a-z0-9-]{0,62}$``."""


def check_namespace(namespace: Optional[str]) -> Optional[str]:
    """The namespace to name in every request: ``None`` for none (``None``
    or empty: the server's ``default``), else the name, which must be 1 to
    63 lowercase letters, digits and ``-``, starting with a letter (the
    server would refuse every request naming another: refused here, at once)."""
    if namespace is None or namespace == "":
        return None
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ValueError(
            f"namespace must be 1 to 63 lowercase letters, digits and '-', starting with a letter, got {namespace!r}"
        )
    return namespace


def _not_composer(url: str, method: str, path: str, status: int) -> ComposerError:
    """The error of an answer from a server that is not a Composer
    coordinator (another service on the port, a proxy's own page): its JSON
    is not the API's, and reading it as such would mislead."""
    message = (
        f"{method} {path}: {url} answered HTTP {status} without a {VERSION_HEADER} header: "
        "it is not a Composer coordinator (check the client's URL)"
    )
    return ComposerError(status, "not_composer", message)


class Transport:
    """Sends requests to one server. A token is sent as ``Authorization:
    Bearer`` and never appears in an error or a log line; a ``namespace``
    is named in every request's ``composer-namespace`` header."""

    def __init__(
        self, url: str, token: Optional[str], timeout: float, user_agent: str, *, namespace: Optional[str] = None
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"url must be http:// or https:// with a host, got {url!r}")
        self.url = url.rstrip("/")
        self.token = token
        self.namespace = check_namespace(namespace)
        self.timeout = timeout
        self.user_agent = user_agent
        self._opener = urllib.request.build_opener(_NoRedirect)

    def request(
        self,
        method: str,
        path: str,
        body: Any = _NO_BODY,
        query: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        *,
        headers: Optional[Mapping[str, str]] = None,
    ) -> tuple[int, Any]:
        """Sends one request (with ``headers`` besides its own: a
        ``traceparent``); returns the status and the decoded answer, or
        raises the ``ComposerError`` of an error answer (``Unavailable`` when
        none came)."""
        url = self.url + path
        if query:
            pairs = [(k, str(v)) for k, v in query.items() if v is not None]
            if pairs:
                url += "?" + urllib.parse.urlencode(pairs)
        data = None if body is _NO_BODY else json.dumps(body, allow_nan=False).encode("utf-8")
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        req.add_header("User-Agent", self.user_agent)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        if self.namespace is not None:
            req.add_header(NAMESPACE_HEADER, self.namespace)
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        began = time.monotonic()
        try:
            with self._opener.open(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
                status = resp.status
                if resp.headers.get(VERSION_HEADER) is None:
                    raise _not_composer(self.url, method, path, status)
        except urllib.error.HTTPError as e:
            with e:
                raw = e.read()
            # A 5xx without the header may be a proxy before a coordinator
            # that is down: unavailable, as before; anything else is not ours.
            if e.code < 500 and e.headers.get(VERSION_HEADER) is None:
                raise _not_composer(self.url, method, path, e.code) from None
            error = _error_of(e.code, str(e.reason), raw, e.headers.get("Retry-After"))
            log.debug("%s %s -> %d %s in %.0fms", method, path, e.code, error.code, (time.monotonic() - began) * 1000)
            raise error from None
        except urllib.error.URLError as e:
            reason = e.reason
            code = "timeout" if isinstance(reason, (socket.timeout, TimeoutError)) else "unreachable"
            raise Unavailable(None, code, f"{method} {path}: {reason}") from None
        except (socket.timeout, TimeoutError):
            waited = timeout or self.timeout
            raise Unavailable(None, "timeout", f"{method} {path}: no answer within {waited:g}s") from None
        except (OSError, http.client.HTTPException) as e:
            # A connection reset mid-answer, a malformed status line …
            raise Unavailable(None, "unreachable", f"{method} {path}: {type(e).__name__}: {e}") from None
        log.debug("%s %s -> %d in %.0fms", method, path, status, (time.monotonic() - began) * 1000)
        if not raw:
            return status, None
        try:
            return status, json.loads(raw)
        except ValueError:
            message = f"{method} {path}: the answer is not JSON: {raw[:200]!r}"
            raise ComposerError(status, "http_error", message) from None
