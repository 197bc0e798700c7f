"""The gateway's part of ``--dyn-debug-perf`` (services/common/debug_perf.py): a request's renderer, timed.

Put in place of the front end's renderer only when the flag is on (front_door.py), so the serving loop has no
check per batch either way: every call that makes the response's bytes (``fold``/``body`` for a whole body,
``sse``/``sse_end``/``sse_error`` for a stream) adds its wall and CPU to the ``render`` section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.common.debug_perf import StagePerf
from services.common.errors import MeshError
from services.gateway.core.delta import Delta

if TYPE_CHECKING:
    from services.gateway.front_door import Renderer

RENDER = "render"


class TimedRenderer:
    """``renderer`` with its output calls timed into ``perf``; token counts and ``usage`` read through."""

    def __init__(self, renderer: Renderer, perf: StagePerf):
        self._renderer = renderer
        self._perf = perf

    @property
    def prompt_tokens(self) -> int:
        return self._renderer.prompt_tokens

    @prompt_tokens.setter
    def prompt_tokens(self, value: int) -> None:
        self._renderer.prompt_tokens = value

    @property
    def completion_tokens(self) -> int:
        return self._renderer.completion_tokens

    @completion_tokens.setter
    def completion_tokens(self, value: int) -> None:
        self._renderer.completion_tokens = value

    @property
    def cached_tokens(self) -> int:
        return self._renderer.cached_tokens

    @cached_tokens.setter
    def cached_tokens(self, value: int) -> None:
        self._renderer.cached_tokens = value

    def fold(self, deltas: list[Delta]) -> None:
        with self._perf.section(RENDER):
            self._renderer.fold(deltas)

    def body(self) -> Any:
        with self._perf.section(RENDER):
            return self._renderer.body()

    def sse(self, deltas: list[Delta]) -> Any:
        with self._perf.section(RENDER):
            return self._renderer.sse(deltas)

    def sse_end(self) -> Any:
        with self._perf.section(RENDER):
            return self._renderer.sse_end()

    def sse_error(self, err: MeshError) -> Any:
        with self._perf.section(RENDER):
            return self._renderer.sse_error(err)

    def usage(self) -> Any:
        return self._renderer.usage()
