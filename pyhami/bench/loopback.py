"""Plain GETs to a process of this machine, past any proxy the environment names.

The benches read the daemon's /readyz and /statusz with them; the repository's harness
(``harness.controlplane``) reads the control plane's the same way."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request


def direct_opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """Straight to the loopback address, whatever proxy the environment names."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def http_get(url: str, *, context: ssl.SSLContext | None = None,
             timeout: float = 5.0) -> tuple[int, bytes]:
    """The answer's status and body; an HTTP error status is an answer, not an exception."""
    try:
        with direct_opener(context).open(url, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())
