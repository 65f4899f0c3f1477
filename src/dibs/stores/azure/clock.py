"""The Blob service's clock: expiry is judged by the time in ``Date`` response headers, refined with
this process's monotonic clock, never by this machine's wall clock (see :class:`ServiceClock`)."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

__all__ = ["Exchange", "PagedExchanges", "ServiceClock"]


class ServiceClock:
    """The Blob service's time, from ``Date`` response headers (one-second resolution), refined.

    A response stamped ``Date: D`` was produced at some service time in ``[D, D + 1)``, and at some
    local monotonic time between sending the request (``sent``) and receiving the headers
    (``received``). So the offset ``service - monotonic`` lies in ``[D - received, D + 1 - sent)``.
    Intersecting these intervals over successive requests pins the offset down to about the
    round-trip time once a few responses have straddled a second boundary. The estimate is the
    middle of the interval, so its error is at most half a second plus half a round trip from the
    first request on (truncating ``Date`` errs by up to a whole second), and a few milliseconds
    once it has converged. It is also clamped into ``[D, D + 1)``: whatever this host's clock does,
    ``now`` is never further from the service's time than the header itself says. Only elapsed
    *monotonic* time of this process is used, never the wall clock, so clock skew between clients
    cannot matter; if the intervals stop agreeing (the service's clock stepped, this host was
    suspended), the estimate starts over from the latest header.
    """

    #: How fast the monotonic clock may drift from the service's (widens the interval over time).
    DRIFT = 1e-4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._low = -math.inf
        self._high = math.inf
        self._at = 0.0
        self._last = -math.inf

    def observe(self, date: float, sent: float, received: float) -> float:
        """The service time at which the response stamped ``date`` (whole seconds) was produced."""
        low, high = date - received, date + 1.0 - sent
        with self._lock:
            slack = self.DRIFT * max(0.0, received - self._at)
            merged_low, merged_high = max(self._low - slack, low), min(self._high + slack, high)
            if merged_low > merged_high:
                # The service's clock stepped, another front end answered, or this host slept: start over.
                merged_low, merged_high = low, high
            self._low, self._high, self._at = merged_low, merged_high, received
            estimate = (sent + received) / 2 + (merged_low + merged_high) / 2
            # Never go backwards within one process unless the header forces it.
            estimate = max(estimate, self._last)
            now = min(max(estimate, date), math.nextafter(date + 1.0, date))
            self._last = now
            return now


class Exchange:
    """Send time, receive time and ``Date`` header of one SDK call, taken by its per-call hooks.

    The request hook fires on the first attempt only (the SDK drops it for retries), which is what the
    clock needs: ``sent`` must be no later than the attempt whose response is used.
    """

    __slots__ = ("date", "received", "sent")

    def __init__(self) -> None:
        self.sent: float | None = None
        self.received: float | None = None
        self.date: str | None = None

    def on_request(self, request: Any) -> None:
        if self.sent is None:
            self.sent = time.monotonic()

    def on_response(self, response: Any) -> None:
        self.received = time.monotonic()
        self.date = response.http_response.headers.get("Date")


class PagedExchanges:
    """The hooks of one paged SDK call (a listing): an :class:`Exchange` for each page's request.

    The SDK hands a paged call's hooks to every page's request. :meth:`take`, called once a page has
    arrived, returns that page's exchange and starts the next page's, so each page is timed by its own
    response (a listing of many pages takes a while, and each page is judged at its own time).
    """

    __slots__ = ("_current",)

    def __init__(self) -> None:
        self._current = Exchange()

    def on_request(self, request: Any) -> None:
        self._current.on_request(request)

    def on_response(self, response: Any) -> None:
        self._current.on_response(response)

    def take(self) -> Exchange:
        """The exchange of the page that has just arrived; the next page starts a new one."""
        taken, self._current = self._current, Exchange()
        return taken
