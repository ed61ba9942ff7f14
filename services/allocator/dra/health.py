"""The DRA plugin's resource-health stream (KEP-4680): `DRAResourceHealth.NodeWatchResources`.

Served on the plugin's service socket beside `DRAPlugin`, in the three versions kubelets ask
for: `v1`, `v1beta1` and `v1alpha1` (k8s.io/kubelet/pkg/apis/dra-health). Each is named in the
registration's `supported_versions` ("v1.DRAResourceHealth", ...): a kubelet that reads that list
takes the newest it knows (k8s.io/kubernetes pkg/kubelet/cm/dra/plugin, `pickHealthService`, v1
first; dra_plugin_manager_test.go, TestPickHealthService), and stops asking a plugin that answers
Unimplemented (TestHealthStreamUnimplemented); kubelets from before that list (1.34, 1.35) call
v1alpha1 whatever the plugin says, again every 5 s while it fails (dra_plugin_manager.go, `add`:
`wait.UntilWithContext(..., 5*time.Second)`), which is what logs "unknown service" against a
plugin without the stream.

Every response is the complete list of the driver's devices: every (profile, placement) of every
partition-mode card, named and pooled as the ResourceSlices publish them (`partkeeper.dra.devices`,
pool = the node), whether offered now or allocated. The kubelet keeps what a response says per
(pool, device) and reports a device missing from later responses Unknown once its timeout passes
(pkg/kubelet/cm/dra/healthinfo.go, `updateHealthInfo`; 30 s by default, `DefaultHealthTimeout`),
so the list is sent at once on connect, again within the recompute's wake-up of any change of
card health (the allocator's one card watch, `services/allocator/core/health.py`, touches the
context's changes), and again every `RESEND_SECONDS` while nothing changes.

What each device says (`device_states`, pure): UNHEALTHY when its card has a fatal fault (an XID
the operator's switches do not ignore, an uncorrectable ECC error) or is lost, with a message
naming the card and the XID; UNHEALTHY for the one device whose partition had an instance-level
XID; HEALTHY otherwise. The plugin never says UNKNOWN itself: the kubelet turns a device Unknown
when the stream ends (it clears the driver's entries) or stays silent past the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import grpc.aio

from partkeeper.claims import StoreReadError
from partkeeper.dra import devices
from partkeeper.drivers import Card
from partkeeper.drivers.cardhealth import CardHealth, Fault
from partkeeper.drivers.profiles import MODELS
from partkeeper.kubelet.drahealth import HEALTH_APIS, HEALTH_SERVICES
from schemas import Claim
from services.allocator.core.state import Context

log = logging.getLogger(__name__)

# Newest first: the order a kubelet prefers them in (module docstring).
SERVICES = HEALTH_SERVICES
# The kubelet forgets a device's health after 30 s without news; a resend well inside that keeps
# a quiet node's devices from turning Unknown.
RESEND_SECONDS = 10.0
MESSAGE_LIMIT = 1024  # the API's bound on `message`; the kubelet cuts longer ones

Health = Literal["HEALTHY", "UNHEALTHY", "UNKNOWN"]


@dataclass(frozen=True, slots=True)
class DeviceState:
    pool: str
    device: str
    health: Health
    message: str = ""


def _card_message(card: int, fault: Fault | None) -> str:
    if fault is None:
        return f"card {card} is lost: every driver call on it fails; nothing new is placed on it"
    said = fault.meaning
    if fault.xid and f"XID {fault.xid}" not in said:
        said += f" (XID {fault.xid})"  # a lost card's meaning does not name its XID
    return f"card {card}: {said}; nothing new is placed on it until it recovers"


def device_states(
    pool: str, cards: Iterable[Card], health: CardHealth, lost: Iterable[int],
    claims: Iterable[Claim],
) -> tuple[DeviceState, ...]:
    """The complete list of the node's DRA devices with their health (pure).

    `claims` only matter for instance-level faults: the claim whose instance (GI, CI) had the
    fault names the device (card, profile, start) of that partition."""
    lost = frozenset(lost)
    broken: dict[str, str] = {}  # device name -> message, for instance-level faults
    for claim in claims:
        inst = claim.instance
        if inst is None:
            continue
        fault = health.instance_fault(claim.card, inst.gi_id, inst.ci_id)
        if fault is not None:
            name = devices.device_name(claim.card, claim.profile, claim.start)
            broken[name] = (f"card {claim.card}, GPU instance {inst.gi_id} compute instance "
                            f"{inst.ci_id} ({inst.uuid}): {fault.meaning}")
    out = []
    # A card found lost at start is listed without its model (drivers/base.py, `lost_card`): what
    # it offers cannot be named, so it is left out until it answers and is enumerated again.
    for spec in devices.all_devices(c for c in cards if c.model in MODELS):
        fault = health.card_fault(spec.card)
        if fault is not None or spec.card in lost:
            out.append(DeviceState(pool, spec.name, "UNHEALTHY", _card_message(spec.card, fault)))
        elif spec.name in broken:
            out.append(DeviceState(pool, spec.name, "UNHEALTHY", broken[spec.name]))
        else:
            out.append(DeviceState(pool, spec.name, "HEALTHY"))
    return tuple(out)


def response(pb2: ModuleType, states: Iterable[DeviceState], now: float) -> Any:
    """One `NodeWatchResourcesResponse` of the version whose message module is `pb2` (v1alpha1
    has no `message`)."""
    with_message = "message" in pb2.DeviceHealth.DESCRIPTOR.fields_by_name
    listed = []
    for state in states:
        fields: dict[str, Any] = {
            "device": pb2.DeviceIdentifier(pool_name=state.pool, device_name=state.device),
            "health": pb2.HealthStatus.Value(state.health),
            "last_updated_time": int(now),
        }
        if with_message and state.message:
            fields["message"] = state.message[:MESSAGE_LIMIT]
        listed.append(pb2.DeviceHealth(**fields))
    return pb2.NodeWatchResourcesResponse(devices=listed)


class HealthFeed:
    """The node's current device list, recomputed on every change of the context; each stream
    waits on `changed` for the next one."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.states: tuple[DeviceState, ...] = ()
        self.revision = 0
        self._changed = asyncio.Event()
        self.ready = asyncio.Event()

    async def run(self) -> None:
        """Recompute on every touch of the context until cancelled."""
        while True:
            woken = self.ctx.changes.next_change()
            await self.refresh()
            await woken.wait()

    async def refresh(self) -> None:
        states = device_states(self.ctx.node, self.ctx.cards, self.ctx.health, self.ctx.lost,
                               await self._claims())
        if states != self.states or not self.ready.is_set():
            self.states = states
            self.revision += 1
            fired, self._changed = self._changed, asyncio.Event()
            fired.set()
        self.ready.set()

    async def _claims(self) -> list[Claim]:
        """The claims of the cards with instance-level faults (none read without one)."""
        cards = sorted({card for card, _, _, _ in self.ctx.health.instances})
        found: list[Claim] = []
        for card in cards:
            try:
                doc, _ = await self.ctx.store.read(card)
            except StoreReadError as exc:
                log.warning("card %d has a faulty partition but its claims could not be read "
                            "(%s): the health stream shows the card's devices as they were "
                            "until the next change", card, exc)
                continue
            found += doc.claims.values()
        return found

    async def stream(self, pb2: ModuleType) -> AsyncIterator[Any]:
        """The responses of one kubelet stream: at once, on each change, and every
        `RESEND_SECONDS`."""
        await self.ready.wait()
        while True:
            changed = self._changed
            yield response(pb2, self.states, time.time())
            with contextlib.suppress(TimeoutError):  # quiet: the same list again
                await asyncio.wait_for(changed.wait(), RESEND_SECONDS)


def _servicer(base: type, pb2: ModuleType, feed: HealthFeed, version: str) -> Any:
    class Servicer(base):
        async def NodeWatchResources(
            self, request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            log.info("kubelet watches the resource health (%s)", version)
            async for answer in feed.stream(pb2):
                yield answer

    return Servicer()


VERSIONS = HEALTH_APIS


def add_to_server(server: grpc.aio.Server, feed: HealthFeed) -> None:
    """Serve every version of the stream on `server` (the plugin's service socket)."""
    for version, (pb2, pb2_grpc) in VERSIONS.items():
        servicer = _servicer(pb2_grpc.DRAResourceHealthServicer, pb2, feed, version)
        pb2_grpc.add_DRAResourceHealthServicer_to_server(servicer, server)
