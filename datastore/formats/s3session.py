"""aiobotocore's HTTP session with every wait of a request bounded, the wait for a pooled connection too.

aiobotocore gives aiohttp only botocore's connect and read timeouts (`ClientTimeout(sock_connect=,
sock_read=)`); `connect`, the bound on getting a connection, which in aiohttp covers the wait for a
free connection of the pool and then the connect, is left unset, so a request that finds every pooled
connection taken (in use, or never given back) waits without end (found in CI: an in-process
`dstore verify` waited 300 s). This session sets `connect` to the connect timeout as well, so that
wait ends as a connect timeout: botocore's `ConnectTimeoutError`, tried again like one
(dstore.formats.objects.storage_options passes it as AioConfig's `http_session_cls`).
"""

from __future__ import annotations

import aiohttp
from aiobotocore.httpsession import AIOHTTPSession


def _bounded(timeout: aiohttp.ClientTimeout) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(
        total=timeout.total,
        connect=timeout.sock_connect,
        sock_connect=timeout.sock_connect,
        sock_read=timeout.sock_read,
    )


class BoundedAIOHTTPSession(AIOHTTPSession):
    """AIOHTTPSession whose requests wait at most the connect timeout for a connection (pool wait and
    connect), then at most the read timeout for each answer (each read of the socket)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        timeout = getattr(self, "_timeout", None)
        if not isinstance(timeout, aiohttp.ClientTimeout):  # an aiobotocore that keeps it elsewhere
            raise TypeError(
                "this aiobotocore's AIOHTTPSession has no ClientTimeout in `_timeout`: dstore cannot bound its "
                "wait for a pooled connection (pip install 'aiobotocore>=2.12.2,<4')"
            )
        self._timeout = _bounded(timeout)

    def _get_request_timeout(self, request):
        """A request's own read timeout (botocore's context), with the connect bound kept."""
        parent = getattr(super(), "_get_request_timeout", None)
        timeout = None if parent is None else parent(request)
        return None if timeout is None else _bounded(timeout)
