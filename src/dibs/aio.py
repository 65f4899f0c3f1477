"""The async face of a client: :class:`AsyncReservations`, for event loops.

It makes the same calls as :class:`dibs.Reservations`, built by the sync client it belongs to: the
same paths of the one flow (:mod:`dibs.flow`), driven on the event loop by
:class:`dibs.seam.AsyncStoreIO` instead of in a thread. Waiting awaits the watch hub (no thread per
waiter), and every store call runs in the runtime's I/O executor. It reads its sync client only
through :class:`SyncClient` (described here rather than imported, so that this module stays below
the client that builds it: ``Reservations.aio()``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, Unpack, overload

from dibs import events, flow, holding
from dibs.keys import Key
from dibs.lease import Lease
from dibs.options import AcquireOptions, AcquireOrBusy, AcquireRaising, AskOptions, CallOptions, WaitOptions
from dibs.outcomes import Acquired, Busy, Hit, Outcome, RunReport
from dibs.records import KeyState
from dibs.runtime import runtime
from dibs.seam import AsyncStoreIO, Source, holding_what

if TYPE_CHECKING:
    from dibs.stores import Store

__all__ = ["AsyncReservations", "SyncClient"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class SyncClient(Source, Protocol):
    """What :class:`AsyncReservations` uses of the :class:`dibs.Reservations` it is the face of: the
    flows its calls are (built once, for both faces), and its rules."""

    rules: flow.Rules

    @property
    def on_store_unavailable(self) -> str: ...

    def key(self, key: str | Key) -> Key: ...

    def status(self, key: str | Key) -> KeyState: ...

    def call(self, key: str | Key, **options: Unpack[CallOptions]) -> flow.Call: ...

    def _asking(self, key: str | Key, owner: str | None, options: AskOptions) -> flow.Flow[Outcome]: ...

    def _acquiring(
        self, key: str | Key, owner: str | None, options: AcquireOptions
    ) -> tuple[flow.Flow[Outcome], events.LazyEmitter]: ...

    def _calling(self, name: str, key: str | Key, options: CallOptions) -> flow.Call: ...

    def _waiting(
        self, key: str | Key, options: WaitOptions
    ) -> tuple[flow.Flow[Hit | None], events.LazyEmitter, Store]: ...

    def close(self) -> None: ...


class AsyncReservations:
    """The same calls for event loops (Airflow's triggerer, async Prefect tasks, services).

    Waiting awaits the watch hub (a future on the caller's loop, no thread per waiter), and every store
    operation runs in the runtime's small I/O executor (:mod:`dibs.runtime`), never on the loop and
    never in the loop's default executor. The decisions are the flow's, as for the sync client.
    """

    def __init__(self, client: SyncClient) -> None:
        self.client = client

    @property
    def store(self) -> Store:
        """The sync client's store."""
        return self.client.store

    async def get_or_reserve(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AskOptions]
    ) -> Outcome:
        """:meth:`Reservations.get_or_reserve`, awaited. A cancelled call leaves nothing held."""
        answer: Outcome = await AsyncStoreIO(self.client).drive(self.client._asking(key, owner, options))
        return answer

    @overload
    async def acquire(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AcquireRaising]
    ) -> Hit | Acquired: ...

    @overload
    async def acquire(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AcquireOrBusy]
    ) -> Hit | Acquired | Busy: ...

    async def acquire(
        self, key: str | Key, owner: str | None = None, **options: Unpack[AcquireOptions]
    ) -> Hit | Acquired | Busy:
        """:meth:`Reservations.acquire`, awaited. A cancelled call leaves nothing held."""
        path, emitter = self.client._acquiring(key, owner, options)
        answer: Hit | Acquired | Busy = await AsyncStoreIO(self.client).drive(path, emitter)
        return answer

    async def wait(
        self,
        key: str | Key,
        *,
        seen: Callable[[KeyState], None] | None = None,
        **options: Unpack[WaitOptions],
    ) -> Hit | None:
        """:meth:`Reservations.wait`, awaited (``decode=False``: a payload is never loaded into this
        process, as Airflow's trigger waits; ``seen`` is its log of who holds the key)."""
        path, emitter, store = self.client._waiting(key, options)
        hit: Hit | None = await AsyncStoreIO(self.client, store=store, seen=seen).drive(path, emitter)
        return hit

    async def status(self, key: str | Key) -> KeyState:
        return await runtime().io(self.client.status, key)

    async def hold(
        self,
        got: Acquired | Lease | holding.HeldLease,
        work: Callable[[], Awaitable[T]],
        *,
        failure_of: holding.FailureOf | None = None,
        logger: holding.Logger | None = None,
        emit: events.Emitter | None = None,
    ) -> RunReport:
        """:meth:`Reservations.hold` for a coroutine: the same decisions, with the store's part in the
        I/O executor. Heartbeats run in their own thread, so they go on even while the work hogs the loop.
        A cancelled work releases its lease (recorded as stopped) even if it is cancelled again meanwhile.
        """
        acquired, keeping = holding_what(got)
        io = AsyncStoreIO(self.client, work, emit=emit, failure_of=failure_of, logger=logger, keeping=keeping)
        policy: Any = self.client.on_store_unavailable
        report: RunReport = await io.drive(flow.hold(acquired, policy))
        return report

    async def compute(
        self,
        key: str | Key,
        fn: Callable[..., Awaitable[Any]],
        *,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Unpack[CallOptions],
    ) -> RunReport:
        """:meth:`Reservations.compute` for a coroutine function."""
        call = self.client._calling("compute", key, options)
        return await call.adrive(
            AsyncStoreIO(self.client, lambda: fn(*args, **(kwargs or {})), emit=call.emitter)
        )

    async def run(
        self, key: str | Key, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """``await fn(*args, **kwargs)``, computed once across every process racing on ``key``."""
        value: R = (await self.compute(key, fn, args=args, kwargs=kwargs)).value
        return value
