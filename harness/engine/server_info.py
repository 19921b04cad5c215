"""Reading what a server says about itself: its resolved configuration, over the engine's info routes."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from harness.benchmark.http import INFO_LIMIT_BYTES, BodyTooLarge, bounded_json, redirect_of
from harness.engine.engines import INFO_ROUTES
from harness.errors import ErrorKind, ServerError


async def read_server_info(base_url: str, routes: tuple[str, ...] = INFO_ROUTES,
                           ) -> dict[str, Any] | None:
    """GET `/server_info` (newer sglang), else `/get_server_info` (the engine's `info_routes`); None when
    no route exists (vLLM and other OpenAI-compatible servers)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for route in routes:
            try:
                async with session.get(base_url + route, allow_redirects=False) as response:
                    if response.status in (404, 405):
                        continue
                    redirect = redirect_of(response)
                    if redirect:
                        raise ServerError(f"cannot read {route}: {redirect}", kind=ErrorKind.SERVER_INFO)
                    response.raise_for_status()
                    info = await bounded_json(response, INFO_LIMIT_BYTES)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, BodyTooLarge) as error:
                raise ServerError(f"cannot read {route}: {error}", kind=ErrorKind.SERVER_INFO) from None
            if isinstance(info, dict):
                return info
    return None
