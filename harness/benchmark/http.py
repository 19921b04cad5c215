"""Reading a server's HTTP responses without trusting it: bodies bounded, redirects never followed.

A server under test is the thing that may be broken. A response body is read only up to a limit
(checked against Content-Length first, then as it streams: aiohttp inflates gzip as it reads, so
the limit bounds the inflated size too), and a redirect is an answer, not an instruction: following
it would score another server under this one's name.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

ANSWER_LIMIT_BYTES = 16 * 1024 * 1024  # an answer, or a teacher-forced pass with its log-probabilities
INFO_LIMIT_BYTES = 4 * 1024 * 1024  # /server_info, /v1/models


class BodyTooLarge(Exception):
    """The body passed its limit: it was not read to the end."""


def redirect_of(response: aiohttp.ClientResponse) -> str | None:
    """`HTTP 307 to http://...: not followed`, or None when the response is no redirect."""
    if 300 <= response.status < 400:
        return f"HTTP {response.status} to {response.headers.get('Location', '?')}: redirects are not followed"
    return None


async def bounded_body(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or BodyTooLarge once it passes `limit` bytes (announced or read)."""
    if response.content_length is not None and response.content_length > limit:
        raise BodyTooLarge(f"response body of {response.content_length} bytes is over the {limit // 2**20} MiB limit")
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"response body over the {limit // 2**20} MiB limit: not read further")
        chunks.append(chunk)
    return b"".join(chunks)


async def bounded_json(response: aiohttp.ClientResponse, limit: int) -> Any:
    """The body as JSON (ValueError when it is not), read under `limit`."""
    return json.loads(await bounded_body(response, limit))


async def flush_cache(session: aiohttp.ClientSession, url: str, attempts: int = 10) -> str | None:
    """POST the server's cache-flush route; None once it says it flushed, else why not (after
    `attempts` tries: sglang refuses while requests are still running)."""
    said = ""
    for attempt in range(attempts):
        try:
            async with session.post(url, allow_redirects=False) as response:
                said = (await bounded_body(response, 4096)).decode(errors="replace").strip()[:200]
                if response.status == 200:
                    return None
                said = f"HTTP {response.status}: {said}"
        except (aiohttp.ClientError, asyncio.TimeoutError, BodyTooLarge) as error:
            said = f"{type(error).__name__}: {error}"
        await asyncio.sleep(0.2 * (attempt + 1))
    return f"the prefix cache could not be flushed ({said})"
