"""A few slots shared fairly between tenants: at most ``per_tenant`` of them held by one tenant, and a freed slot
goes to the next tenant in turn (round robin) rather than to whoever queued the most."""

import asyncio
from collections import Counter, OrderedDict, deque


class TenantQueueFull(Exception):
    pass


class FairSlots:
    """Used from one event loop; ``acquire`` then ``release`` once per job."""

    def __init__(self, slots: int, per_tenant: int, max_waiting_per_tenant: int) -> None:
        self.slots = slots
        self.per_tenant = per_tenant
        self.max_waiting_per_tenant = max_waiting_per_tenant
        self._running: Counter[str] = Counter()
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    async def acquire(self, tenant: str) -> None:
        """Wait for a slot; raises TenantQueueFull when ``tenant`` already has its most jobs waiting."""
        if tenant not in self._waiting and self._may_start(tenant):
            self._running[tenant] += 1
            return
        queue = self._waiting.setdefault(tenant, deque())
        if len(queue) >= self.max_waiting_per_tenant:
            raise TenantQueueFull
        turn = asyncio.get_running_loop().create_future()
        queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release(tenant)  # the slot came as the waiter gave up
            else:
                self._forget(tenant, turn)
            raise

    def release(self, tenant: str) -> None:
        self._running[tenant] -= 1
        if self._running[tenant] == 0:
            del self._running[tenant]
        self._hand_out()

    def _may_start(self, tenant: str) -> bool:
        return self._running.total() < self.slots and self._running[tenant] < self.per_tenant

    def _hand_out(self) -> None:
        while self._running.total() < self.slots:
            tenant = next((t for t in self._waiting if self._running[t] < self.per_tenant), None)
            if tenant is None:
                return
            turn = self._waiting[tenant].popleft()
            if self._waiting[tenant]:
                self._waiting.move_to_end(tenant)
            else:
                del self._waiting[tenant]
            if not turn.cancelled():
                self._running[tenant] += 1
                turn.set_result(None)

    def _forget(self, tenant: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._waiting[tenant]
