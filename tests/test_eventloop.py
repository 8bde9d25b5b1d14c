"""The event loop of the server and the load client (`specgen.eventloop`)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from specgen import eventloop


def test_run_returns_the_result_on_uvloop_where_it_is_installed() -> None:
    async def main() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    expected = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    assert eventloop.run(main()) == expected


def test_run_raises_what_the_coroutine_raises() -> None:
    async def main() -> None:
        raise ValueError("from the coroutine")

    with pytest.raises(ValueError, match="from the coroutine"):
        eventloop.run(main())
