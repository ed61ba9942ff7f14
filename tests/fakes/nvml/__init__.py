"""The fake NVML: `fake_nvml.c` and `fake_nvml_mig.c` built against nvidia-nvml-dev's nvml.h,
and its controls.

GPU-instance ids follow the slot tree as real NVML's do (full card GI 0, halves 1-2, quarters 3-6,
eighths 7-14), so GI 0 is an ordinary partition everywhere. With a proc root the fake publishes the
MIG capability files and `/proc/devices` (the `nvidia-caps` major, CAPS_MAJOR).

`build(out_dir)` compiles `libnvidia-ml.so.1`; `FakeNvml.create(library, state, ...)` writes a new
card state. Tests drive the library through the real nvidia-ml-py (the code under test) and use
this class only for what is no NVML call: adding cards, starting processes on an instance,
making a card report other placements than NVIDIA's, injecting failures.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from tests_support.clib import (
    COMMON_INCLUDE,
    COMMON_SOURCES,
    FakeLibrary,
    build_shared_library,
    vendor_include_dir,
)

HERE = Path(__file__).parent
SOURCES = (HERE / "fake_nvml.c", HERE / "fake_nvml_mig.c", HERE / "fake_nvml_events.c")
SONAME = "libnvidia-ml.so.1"

# nvml.h return codes the tests inject (nvmlReturn_t).
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_DRIVER_NOT_LOADED = 9
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23
ERROR_GPU_IS_LOST = 15
ERROR_UNKNOWN = 999

# nvml.h's event types and "no instance" id (nvmlEventData_t).
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
NO_INSTANCE = 0xFFFFFFFF

CAPS_MAJOR = 235  # the fake's /proc/devices: nvidia-caps (fake_nvml.h FAKE_CAPS_MAJOR)


def build(out_dir: Path) -> Path:
    include = vendor_include_dir("nvidia-nvml-dev", "nvml.h")
    return build_shared_library(
        SONAME, [*SOURCES, *COMMON_SOURCES], out_dir, include_dirs=[include, HERE, COMMON_INCLUDE]
    )


class FakeNvml(FakeLibrary):
    state_env = "FAKE_NVML_STATE"

    @classmethod
    def create(cls, library: Path, state: Path, proc_root: Path | None = None) -> FakeNvml:
        """A new state with no cards; with `proc_root`, MIG capability files are published
        under `<proc_root>/driver/nvidia/capabilities` as the kernel driver does."""
        fake = cls(library, state)
        fake.ensure_resolves()
        root = str(proc_root).encode() if proc_root else None
        fake.check(fake.lib.fake_nvml_new(bytes(state), root), "creating the state")
        return fake

    def add_gpu(self, model: str, mig: bool = True, pending: bool | None = None) -> int:
        """A card of `model` (A100-40GB, H100-80GB, H200-141GB or T4); returns its index."""
        pending = mig if pending is None else pending
        rc = self.lib.fake_nvml_add_gpu(bytes(self.state), model.encode(), int(mig), int(pending))
        return self.check(rc, f"adding a {model}")

    def set_processes(self, mig_uuid: str, count: int) -> None:
        rc = self.lib.fake_nvml_set_processes(bytes(self.state), mig_uuid.encode(), count)
        self.check(rc, f"setting processes on {mig_uuid}")

    def set_profile(self, gpu: int, profile_const: int, starts: tuple[int, ...], count: int):
        """Make card `gpu` report other legal starts / instance count for one GI profile."""
        mask = sum(1 << s for s in starts)
        rc = self.lib.fake_nvml_set_profile(bytes(self.state), gpu, profile_const, mask, count)
        self.check(rc, f"changing profile {profile_const} of card {gpu}")

    def set_placements(self, gpu: int, profile_const: int, code: int = SUCCESS,
                       descending: bool = False) -> None:
        """Card `gpu` answers `code` (SUCCESS: its placements) for one GI profile's placements,
        listing them highest start first when `descending`."""
        rc = self.lib.fake_nvml_set_placements(bytes(self.state), gpu, profile_const, code,
                                               int(descending))
        self.check(rc, f"making profile {profile_const} of card {gpu} answer {code}")

    def set_mig_mode(self, gpu: int, current: bool, pending: bool | None = None) -> None:
        """MIG mode switched out of band; switching it off removes every instance of the card."""
        pending = current if pending is None else pending
        rc = self.lib.fake_nvml_set_mig_mode(bytes(self.state), gpu, int(current), int(pending))
        self.check(rc, f"setting MIG mode of card {gpu}")

    def total_calls(self) -> int:
        """Every NVML call made since the state was created (the controls not counted)."""
        return self.calls("*")

    def set_ci_info_parent(self, on: bool) -> None:
        """nvmlComputeInstanceGetInfo names the parent card (nvml.h's word) instead of the CI's
        own MIG device (what NVIDIA's DRA driver reads the new UUID from)."""
        self.check(self.lib.fake_nvml_set_ci_info_parent(bytes(self.state), int(on)), "CI info")

    def raise_event(self, gpu: int, event_type: int, data: int = 0,
                    gi: int = NO_INSTANCE, ci: int = NO_INSTANCE) -> None:
        """Raise one NVML event on card `gpu` (an XID: EVENT_XID with the XID as `data`),
        attributed to GPU instance `gi` and compute instance `ci` when given."""
        rc = self.lib.fake_nvml_raise(bytes(self.state), gpu, ctypes.c_ulonglong(event_type),
                                      ctypes.c_ulonglong(data), gi, ci)
        self.check(rc, f"raising event {event_type:#x} on card {gpu}")

    def set_lost(self, gpu: int, lost: bool = True) -> None:
        """Card `gpu` falls off the bus (every call on it answers GPU_IS_LOST), or comes back."""
        self.check(self.lib.fake_nvml_set_lost(bytes(self.state), gpu, int(lost)),
                   f"making card {gpu} {'lost' if lost else 'answer again'}")
