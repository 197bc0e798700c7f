"""In-flight requests this router sent, per worker, until they are released.

The count is what least-loaded compares. Bookings are keyed by request id so a
release that arrives twice (or for a request another replica routed) is a no-op.
"""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class _Booking:
    worker_id: str
    prompt_tokens: int


class Bookings:
    def __init__(self) -> None:
        self._by_request: dict[str, _Booking] = {}
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._prompt_tokens: collections.Counter[str] = collections.Counter()

    def book(self, request_id: str, worker_id: str, prompt_tokens: int) -> None:
        self.release(request_id)
        self._by_request[request_id] = _Booking(worker_id, prompt_tokens)
        self._in_flight[worker_id] += 1
        self._prompt_tokens[worker_id] += prompt_tokens

    def release(self, request_id: str) -> bool:
        booking = self._by_request.pop(request_id, None)
        if booking is None:
            return False
        self._in_flight[booking.worker_id] -= 1
        self._prompt_tokens[booking.worker_id] -= booking.prompt_tokens
        if self._in_flight[booking.worker_id] <= 0:
            del self._in_flight[booking.worker_id]
            self._prompt_tokens.pop(booking.worker_id, None)
        return True

    def drop_worker(self, worker_id: str) -> None:
        """Forgets a worker that left; its requests fail or migrate elsewhere."""
        for request_id in [r for r, b in self._by_request.items() if b.worker_id == worker_id]:
            self.release(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_request

    def in_flight(self, worker_id: str) -> int:
        return self._in_flight.get(worker_id, 0)

    def per_worker(self) -> dict[str, int]:
        """Requests booked on each worker that has any."""
        return dict(self._in_flight)

    def prompt_tokens(self, worker_id: str) -> int:
        return self._prompt_tokens.get(worker_id, 0)

    def __len__(self) -> int:
        return len(self._by_request)
