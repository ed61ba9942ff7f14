"""NVML's card events as `CardEvent`s: one event set for the node's cards.

As NVIDIA's device plugin does (k8s-device-plugin, internal/rm/health.go): every card's whole-card
handle is registered for critical XIDs and both ECC error types, masked by what the card supports
(nvml.h: per-instance registration with MIG device handles is not supported; an XID on a MIG card
names its GPU and compute instance in the event data instead). Where the device plugin marks every
device unhealthy when a wait fails, partkeeper asks each card which one stopped answering
(`NVML_ERROR_GPU_IS_LOST` from its handle), so the other cards keep serving; a card that was lost
and answers again is reported recovered.

`wait` blocks in `nvmlEventSetWait_v2`: call it from a worker thread.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

from partkeeper.drivers.base import ReadError
from partkeeper.drivers.cardhealth import CardEvent, EventKind

__all__ = ["NvmlEvents"]


class NvmlEvents:
    """The node's event set. Opening it registers every card; a card that cannot be registered
    because it is lost is reported lost by the first `wait`."""

    def __init__(self, nv: ModuleType, count: int) -> None:
        self.nv = nv
        self._count = count
        self._lost: set[int] = set()
        self._pending: list[CardEvent] = []
        self._uuids: dict[str, int] = {}
        self._set: Any = None
        self._open()

    def _open(self) -> None:
        """A new event set with every card that answers. A lost card keeps a wait answering
        GPU_IS_LOST at once, so it stays out of the set until it answers again; an event raised
        while the set is rebuilt is missed (the card it concerns is re-read by the caller)."""
        nv = self.nv
        if self._set is not None:
            self.close()
        self._set = self._read(None, "creating the event set", nv.nvmlEventSetCreate)
        wanted = (
            nv.nvmlEventTypeXidCriticalError
            | nv.nvmlEventTypeDoubleBitEccError
            | nv.nvmlEventTypeSingleBitEccError
        )
        for card in range(self._count):
            if card in self._lost:
                continue
            try:
                dev = nv.nvmlDeviceGetHandleByIndex(card)
                self._uuids[nv.nvmlDeviceGetUUID(dev)] = card
                supported = nv.nvmlDeviceGetSupportedEventTypes(dev)
                if wanted & supported:
                    nv.nvmlDeviceRegisterEvents(dev, wanted & supported, self._set)
            except nv.NVMLError as exc:
                if self._is_lost(exc):
                    self._mark_lost(card, str(exc))
                    continue
                self.close()
                raise ReadError("events", card, None, f"registering for events: {exc}") from exc

    def _read(self, card: int | None, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            raise ReadError("events", card, None, f"{what}: {exc}") from exc

    def _is_lost(self, exc: BaseException) -> bool:
        return getattr(exc, "value", None) == self.nv.NVML_ERROR_GPU_IS_LOST

    def _mark_lost(self, card: int, said: str) -> None:
        if card not in self._lost:
            self._lost.add(card)
            self._pending.append(CardEvent(card, EventKind.LOST, detail=said))

    def wait(self, timeout_s: float) -> list[CardEvent]:
        if self._pending:
            found, self._pending = self._pending, []
            return found
        nv = self.nv
        try:
            data = nv.nvmlEventSetWait_v2(self._set, max(1, int(timeout_s * 1000)))
        except nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == nv.NVML_ERROR_TIMEOUT:
                return self._recovered()
            if code == nv.NVML_ERROR_GPU_IS_LOST:
                return self._find_lost(str(exc))
            raise ReadError("events", None, None, f"waiting for events: {exc}") from exc
        return [self._event(data)]

    def _event(self, data: Any) -> CardEvent:
        nv = self.nv
        try:
            card = self._uuids.get(nv.nvmlDeviceGetUUID(data.device), -1)
        except nv.NVMLError as exc:
            raise ReadError("events", None, None, f"naming the card of an event: {exc}") from exc
        said = f"NVML event type {data.eventType:#x}, data {data.eventData}"
        if data.eventType & nv.nvmlEventTypeXidCriticalError:
            return CardEvent(card, EventKind.XID, int(data.eventData), int(data.gpuInstanceId),
                             int(data.computeInstanceId), said)
        if data.eventType & nv.nvmlEventTypeDoubleBitEccError:
            return CardEvent(card, EventKind.ECC_UNCORRECTABLE, detail=said)
        return CardEvent(card, EventKind.ECC_CORRECTABLE, detail=said)

    def _answers(self, card: int) -> BaseException | None:
        """None when the card answers; the lost error when it does not."""
        nv = self.nv
        try:
            nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(card))
        except nv.NVMLError as exc:
            if self._is_lost(exc):
                return exc
            raise ReadError("events", card, None, f"reading the UUID: {exc}") from exc
        return None

    def _find_lost(self, said: str) -> list[CardEvent]:
        """The wait says some card is lost: which one (each card asked once)."""
        for card in range(self._count):
            err = self._answers(card)
            if err is not None:
                self._mark_lost(card, f"{said} ({err})")
        self._open()
        found, self._pending = self._pending, []
        return found

    def _recovered(self) -> list[CardEvent]:
        back = [card for card in sorted(self._lost) if self._answers(card) is None]
        for card in back:
            self._lost.discard(card)
        if back:
            self._open()
        return [CardEvent(card, EventKind.RECOVERED, detail="the card answers again")
                for card in back]

    def close(self) -> None:
        if self._set is None:
            return
        # A set of a lost card or a shut-down library has nothing left to free.
        with contextlib.suppress(self.nv.NVMLError):
            self.nv.nvmlEventSetFree(self._set)
        self._set = None
