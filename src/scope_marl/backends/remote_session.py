"""Continuous batching against a server that batches concurrent requests itself (vLLM).

A :class:`RemoteSession` is the rollout engine's view of such a server, with the same calls as a
local :class:`~scope_marl.backends.decode_session.DecodeSession`: :meth:`add` sends a prompt as its
own request at once (on the backend's thread pool), and each :meth:`step` hands back the requests
that have finished, waiting at most ``POLL_S`` for the first. So a turn is in flight the moment it
is ready and its episode's next turn goes out the moment it returns; no turn waits for the slowest
of a batch, and the server's own continuous batching sees every turn that could run. Each request
carries its own seed, so what a turn samples does not depend on when it was sent.

A request that fails (the server refused it, the connection dropped) comes back as its exception
for that turn alone; its neighbours go on.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from scope_marl.backends.base import BackendError, Generation

# How long a step waits for the first request to finish. Short, so that a rollout with local
# sessions beside this one keeps stepping them; the loop around it costs microseconds a turn.
POLL_S = 0.02


class RemoteSession:
    """Requests in flight on a server, each handed back as it finishes (module docstring).

    ``send(prompt_ids, adapter, seed)`` checks the prompt (raising for a bad one, which is then
    refused alone) and returns the future of its generation."""

    def __init__(self, send: Callable[[list[int], str | None, int | None], Future]):
        self._send = send
        self._in_flight: dict[Future, Any] = {}  # future -> the caller's tag, in the order sent

    def add(
        self,
        prompt_ids: list[int],
        adapter: str | None = None,
        key: Hashable | None = None,  # unused: the server's prefix cache finds a conversation's turns itself
        seed: int | None = None,
        on_token: Callable[[int], None] | None = None,  # refused: a server's replies come whole
        tag: Any = None,
    ) -> None:
        """Send a prompt; its generation comes back from a later :meth:`step` with ``tag``. ``key``
        is not needed: the server's prefix cache finds a conversation's earlier turns itself."""
        if on_token is not None:
            raise BackendError("a server session returns whole replies; stream tokens with a local model (hf: or embedded)")
        self._in_flight[self._send(list(prompt_ids), adapter, seed)] = tag

    @property
    def busy(self) -> bool:
        """Whether any request is still in flight."""
        return bool(self._in_flight)

    @property
    def tags(self) -> list:
        """The tags of every request still in flight."""
        return list(self._in_flight.values())

    def step(self, timeout: float = POLL_S) -> list[tuple[Any, Generation | Exception]]:
        """The requests that finished (waiting up to ``timeout`` for the first), as ``(tag,
        generation)``, or ``(tag, exception)`` for a request that failed."""
        if not self._in_flight:
            return []
        done, _ = wait(self._in_flight, timeout=timeout, return_when=FIRST_COMPLETED)
        finished = []
        for future in [f for f in self._in_flight if f in done]:  # in the order sent
            tag = self._in_flight.pop(future)
            error = future.exception()
            finished.append((tag, error if error is not None else future.result()))
        return finished

    def close(self) -> None:
        """Stop waiting for what is still in flight (requests not yet started are cancelled)."""
        for future in self._in_flight:
            future.cancel()
        self._in_flight.clear()
