"""Configuration from the environment (docs/contract.md section 4), declared once, read once.

Each setting is declared once, on its `Config` field: the variable, how its text is read and
checked, the default and one line of documentation (`setting(...)`). `load()` is driven by those
declarations, and so is the reference table in docs/configuration.md
(`python -m partkeeper.config --markdown`; a test fails when the two disagree). A few variables
are checked here but read elsewhere (`ELSEWHERE`: fault points, the log level, OpenTelemetry's).

Every service calls `load()` once at start; a bad value stops the process with one sentence naming
the variable, the value and what is expected.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast

from partkeeper.drivers import cardhealth
from partkeeper.errors import StartupError

DEFAULT_METRICS_PORTS = {"watcher": 9401, "allocator": 9402, "reclaimer": 9403, "gc": 9404}
# Per driver, the default (partition prefix, sliced resource): the names gpustack-operator
# publishes for the same hardware (docs/drivers.md); PK_RESOURCE_PREFIX / PK_SLICED_RESOURCE win.
RESOURCE_NAMES = {
    "nvml": ("nvidia.com/mig-", "nvidia.com/gpu.sliced"),
    "hgml": ("alibabacloud.com/ppu.partitioned.mig-", "alibabacloud.com/ppu.sliced"),
    "dmi": ("hygon.com/dcu.partitioned.mig-", "hygon.com/dcu.sliced"),
    "sim": ("nvidia.com/mig-", "nvidia.com/gpu.sliced"),
}

Parse = Callable[[str, str], Any]  # (variable, text) -> value; raises ConfigError


class ConfigError(StartupError, ValueError):
    """A configuration value is missing or malformed; the message says which and why."""


# -- how a variable's text is read ------------------------------------------------------------


def text(_name: str, raw: str) -> str:
    return raw


def path(_name: str, raw: str) -> Path:
    return Path(raw)


def choice(*allowed: str) -> Parse:
    def parse(name: str, raw: str) -> str:
        value = raw.strip()
        if value not in allowed:
            raise ConfigError(
                f"{name}={value!r} is not valid; expected one of: {', '.join(allowed)}"
            )
        return value

    return parse


def number(*, minimum: float) -> Parse:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}={raw.strip()!r} is not a number") from None
        if value < minimum:
            raise ConfigError(f"{name}={raw.strip()!r} must be at least {minimum:g}")
        return value

    return parse


def xids(name: str, raw: str) -> str:
    """A list of XIDs or `all`, checked here so that a typo stops the service at start."""
    try:
        cardhealth.parse_xids(raw, name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return raw


def integer(*, minimum: int) -> Parse:
    def parse(name: str, raw: str) -> int:
        value = raw.strip()
        if not value.isdigit():
            raise ConfigError(f"{name}={value!r} is not a whole number")
        if int(value) < minimum:
            raise ConfigError(f"{name}={value!r} must be at least {minimum}")
        return int(value)

    return parse


def url_list(name: str, raw: str) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in raw.split(",") if u.strip())
    for url in urls:
        if "://" not in url:
            raise ConfigError(f"{name} entry {url!r} has no scheme; expected nats://host:port")
    return urls


# nats-server's limit on stream and consumer names (JSMaxNameLen): a durable name carries the
# node's subject token, and a longer one is refused on every attempt to create it.
NATS_NAME_LIMIT = 255


def node_name(name: str, raw: str) -> str:
    from schemas.names import DURABLE_SERVICES, STREAMS, durable_name, encode_token

    value = raw.strip()
    if not value or len(value) > 253:
        raise ConfigError(f"{name}={value!r} must be 1 to 253 characters")
    longest = max((durable_name(service, value, stream.name) for service in DURABLE_SERVICES
                   for stream in STREAMS), key=len)
    if len(longest) > NATS_NAME_LIMIT:
        raise ConfigError(
            f"{name}={value[:60]!r}... cannot name this node on the bus: its subject token "
            f"({len(encode_token(value))} characters) makes durable consumer names of "
            f"{len(longest)} characters, and NATS takes at most {NATS_NAME_LIMIT}")
    return value


def fault_points(_name: str, raw: str) -> str:
    from partkeeper.faults import parse as parse_faults  # validated here, applied by faults

    parse_faults(raw.strip())
    return raw.strip()


# -- the declaration --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable: how it is read, its default, one line for the reference."""

    env: str
    doc: str
    parse: Parse | None  # None: not checked here (a standard variable of a library)
    default: Any = None
    factory: Callable[[], Any] | None = None  # a default computed at start (read by `parse`)
    shown: str = ""  # the default as the reference table says it, when its value does not
    # A default derived from the settings declared before it (their values, by attribute).
    derive: Callable[[Mapping[str, Any]], Any] | None = None

    def default_value(self) -> Any:
        if self.factory is not None and self.parse is not None:
            return self.parse(self.env, str(self.factory()))
        return self.default

    def default_cell(self) -> str:
        if self.shown:
            return self.shown
        value = self.default
        if value is None:
            return "none"
        if isinstance(value, tuple):
            value = ",".join(value)
        if isinstance(value, float):
            value = f"{value:g}"
        return f"`{value}`"


def setting(env: str, doc: str, parse: Parse, default: Any = None, *,
            factory: Callable[[], Any] | None = None, shown: str = "",
            derive: Callable[[Mapping[str, Any]], Any] | None = None) -> Any:
    """A `Config` field read from `env` (an empty variable means the default)."""
    declared = Setting(env, doc, parse, default, factory, shown, derive)
    meta = {"setting": declared}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    nats_urls: tuple[str, ...] = setting(
        "NATS_URL", "NATS server(s), comma separated", url_list, ("nats://127.0.0.1:4222",))
    nats_user: str | None = setting("NATS_USER", "user of user/password credentials", text)
    nats_password: str | None = setting(
        "NATS_PASSWORD", "password of user/password credentials", text)
    nats_creds: str | None = setting("NATS_CREDS", "a `.creds` file (JWT + nkey)", text)
    node: str = setting(
        "PK_NODE_NAME", "this node's name (the DaemonSet sets it from `spec.nodeName`)",
        node_name, factory=socket.gethostname, shown="host name")
    kubeconfig: str | None = setting(
        "KUBECONFIG", "API server access; in-cluster config when unset inside a Pod", text,
        shown="standard")
    kubelet_dir: Path = setting(
        "PK_KUBELET_DIR",
        "device-plugin dir holding `kubelet.sock`; the allocator puts its sockets here",
        path, Path("/var/lib/kubelet/device-plugins"))
    pod_resources_socket: Path = setting(
        "PK_POD_RESOURCES_SOCKET",
        "kubelet pod-resources socket, used to narrow which container an `Allocate` serves",
        path, Path("/var/lib/kubelet/pod-resources/kubelet.sock"))
    pods_dir: Path = setting(
        "PK_PODS_DIR",
        "per-Pod working directories (partition descriptors, logical-slice files)",
        path, Path("/var/lib/partkeeper/pods"))
    driver: Literal["nvml", "hgml", "dmi", "sim"] = setting(
        "PK_DRIVER", "`nvml` (NVIDIA), `hgml` (T-Head PPU), `dmi` (Hygon DCU) or `sim`",
        choice(*RESOURCE_NAMES), "nvml")
    sim_state: Path = setting(
        "PK_SIM_STATE", "the simulated driver's state file", path,
        Path("/var/lib/partkeeper/sim.json"))
    foreign_policy: Literal["keep", "reap"] = setting(
        "PK_FOREIGN_POLICY",
        "`keep` (report only) or `reap` (destroy idle foreign instances older than the grace)",
        choice("keep", "reap"), "keep")
    foreign_grace_seconds: float = setting(
        "PK_FOREIGN_GRACE_SECONDS",
        "how old an idle foreign instance must be before `reap` destroys it",
        number(minimum=0), 300.0)
    metrics_port: int | None = setting(
        "PK_METRICS_PORT",
        "Prometheus `/metrics` port, also serving the probes `/livez` and `/readyz` (0 = off)",
        integer(minimum=0),
        shown="watcher 9401, allocator 9402, reclaimer 9403, gc 9404")  # None: per service
    resync_seconds: float = setting(
        "PK_RESYNC_SECONDS", "period of the reclaimer's and GC's reconcile passes",
        number(minimum=0.05), 10.0)
    stream_replicas: int = setting(
        "PK_STREAM_REPLICAS", "replicas of the streams and buckets `partkeeper provision` creates",
        integer(minimum=1), 1, shown="`1` (3 in `deploy/`)")
    store_bytes: int = setting(
        "PK_STORE_BYTES",
        "bytes all streams and buckets together may hold (`partkeeper provision` shares them out; "
        "[operations.md](operations.md), Sizing); the server's and the account's JetStream file "
        "store must allow at least this times `PK_STREAM_REPLICAS`", integer(minimum=1 << 24),
        2 * 1024**3, shown="`2147483648` (2 GiB)")
    slices_per_card: int = setting(
        "PK_SLICES_PER_CARD", "logical slices offered per sliced card", integer(minimum=1), 4)
    slice_limiter: Literal["none", "hami-core"] = setting(
        "PK_SLICE_LIMITER",
        "who enforces logical slices: `none` (slices are handed out and reported as unenforced "
        "everywhere) or `hami-core` (HAMi-core's `libvgpu.so` preloaded into the container; see "
        "[operations.md](operations.md), Slice limiter)", choice("none", "hami-core"), "none")
    slice_limiter_dir: Path = setting(
        "PK_SLICE_LIMITER_DIR",
        "`hami-core`: the host dir holding `libvgpu.so` and `ld.so.preload` (HAMi's "
        "`$HOOK_PATH/vgpu`), mounted at the same path into the allocator, which does not start "
        "on a node with sliced cards when they are missing", path, Path("/usr/local/vgpu"))
    resource_prefix: str = setting(
        "PK_RESOURCE_PREFIX", "prefix of the per-profile resources", text, "nvidia.com/mig-",
        shown="per driver: `nvidia.com/mig-`; `alibabacloud.com/ppu.partitioned.mig-` (hgml); "
        "`hygon.com/dcu.partitioned.mig-` (dmi); docs/drivers.md, Resource names",
        derive=lambda v: RESOURCE_NAMES[v["driver"]][0])
    sliced_resource: str = setting(
        "PK_SLICED_RESOURCE", "the logical-slice resource", text, "nvidia.com/gpu.sliced",
        shown="per driver: `nvidia.com/gpu.sliced`; `alibabacloud.com/ppu.sliced` (hgml); "
        "`hygon.com/dcu.sliced` (dmi)",
        derive=lambda v: RESOURCE_NAMES[v["driver"]][1])
    room_wait_seconds: float | None = setting(  # None: the allocator's own default
        "PK_ROOM_WAIT_SECONDS",
        "how long an `Allocate` that finds no room waits for it (making room, ending at once "
        "when kubelet cancels the call) before it refuses; see [allocator.md](allocator.md)",
        number(minimum=0), shown="`30`")
    device_list_strategy: Literal["envvar", "cdi"] = setting(
        "PK_DEVICE_LIST_STRATEGY",
        "`envvar` (`NVIDIA_VISIBLE_DEVICES` plus device specs) or `cdi` (also a CDI spec per "
        "partition, returned in `cdi_devices`)", choice("envvar", "cdi"), "envvar")
    cdi_dir: Path = setting(
        "PK_CDI_DIR",
        "where CDI specs of created partitions are written (`cdi` strategy, and always in DRA "
        "mode)",
        path, Path("/var/run/cdi"))
    driver_root: Path = setting(
        "PK_DRIVER_ROOT",
        "host root of the driver's `/dev` nodes named in device specs, where nvml makes the MIG "
        "capability nodes (e.g. `/run/nvidia/driver`; for hgml and dmi also of "
        "`/etc/dmi_mig_config`, `/sys` and `/opt/hyhal`)",
        path, Path("/"))
    proc_root: Path = setting(
        "PK_PROC_ROOT", "where `driver/nvidia/capabilities` (MIG capability minors) and `devices` "
        "(the `nvidia-caps` major) are read (hgml: `driver/alixpu/capabilities`), and the host's "
        "boot id, `sys/kernel/random/boot_id` (a reboot told from a restart, both services)",
        path, Path("/proc"))
    mode: Literal["deviceplugin", "dra"] = setting(
        "PK_MODE",
        "`deviceplugin` or `dra` (ResourceSlices and a DRA kubelet plugin, see [dra.md](dra.md))",
        choice("deviceplugin", "dra"), "deviceplugin")
    # DRA mode's dirs default to siblings of the device-plugin dir, as kubelet lays them out.
    kubelet_plugins_dir: Path = setting(
        "PK_KUBELET_PLUGINS_DIR", "DRA mode: the kubelet's `plugins` dir", path,
        Path("/var/lib/kubelet/plugins"), shown="sibling `plugins` of `PK_KUBELET_DIR`",
        derive=lambda v: v["kubelet_dir"].parent / "plugins")
    kubelet_registry_dir: Path = setting(
        "PK_KUBELET_REGISTRY_DIR", "DRA mode: the kubelet's `plugins_registry` dir", path,
        Path("/var/lib/kubelet/plugins_registry"),
        shown="sibling `plugins_registry` of `PK_KUBELET_DIR`",
        derive=lambda v: v["kubelet_dir"].parent / "plugins_registry")
    health_ignore_xids: str = setting(
        "PK_HEALTH_IGNORE_XIDS",
        "XIDs that fail no card besides the application XIDs (13, 31, 43, 45, 68, 109), comma "
        "separated, or `all` (as the device plugin's `DP_DISABLE_HEALTHCHECKS`; see "
        "[drivers.md](drivers.md), Card health)", xids, "")
    health_enable_xids: str = setting(
        "PK_HEALTH_ENABLE_XIDS",
        "XIDs that fail a card even if ignored above (as `DP_ENABLE_HEALTHCHECKS`)", xids, "")

    def xid_policy(self) -> cardhealth.XidPolicy:
        return cardhealth.policy(self.health_ignore_xids, self.health_enable_xids)

    def metrics_port_for(self, service: str) -> int:
        if self.metrics_port is not None:
            return self.metrics_port
        return DEFAULT_METRICS_PORTS.get(service, 0)


# Checked or documented here, read by the module named in the line.
ELSEWHERE: tuple[Setting, ...] = (
    Setting("PK_FAULTS", "fault points for tests, e.g. `allocator.after_create=exit` (see below; "
            "read by `partkeeper.faults`)", fault_points),
    Setting("PK_LOG_LEVEL", "`debug`, `info`, `warning`, `error` (read by "
            "`partkeeper.telemetry.logs`)", None, "info"),
    Setting("OTEL_EXPORTER_OTLP_ENDPOINT", "standard OpenTelemetry variables (also "
            "`OTEL_EXPORTER_OTLP_INSECURE`, `OTEL_TRACES_EXPORTER`, `OTEL_SERVICE_NAME`, ...); "
            "spans are exported only when an endpoint is set or `OTEL_TRACES_EXPORTER` asks "
            "(see [observability.md](observability.md))", None, shown="SDK defaults"),
)


def declared() -> list[tuple[str, Setting]]:
    """(Config attribute, its setting) for every field, in declaration order."""
    return [(f.name, cast(Setting, f.metadata["setting"])) for f in dataclasses.fields(Config)]


def _read(declared_setting: Setting, env: Mapping[str, str], before: Mapping[str, Any]) -> Any:
    raw = env.get(declared_setting.env, "")
    if raw.strip() and declared_setting.parse is not None:
        return declared_setting.parse(declared_setting.env, raw)
    if declared_setting.derive is not None:
        return declared_setting.derive(before)
    return declared_setting.default_value()


def load(env: Mapping[str, str] | None = None) -> Config:
    """Read the configuration from `env` (default: the process environment)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name, declared_setting in declared():
        values[name] = _read(declared_setting, env, values)
    for other in ELSEWHERE:
        _read(other, env, values)
    return Config(**values)


# -- the reference table ----------------------------------------------------------------------

TABLE_BEGIN = "<!-- settings: generated by `python -m partkeeper.config --markdown` -->"
TABLE_END = "<!-- end of settings -->"


def markdown() -> str:
    """The reference table of docs/configuration.md, between its markers."""
    rows = [s for _, s in declared()] + list(ELSEWHERE)
    lines = [TABLE_BEGIN, "| variable | meaning | default |", "|---|---|---|"]
    lines += [f"| `{s.env}` | {s.doc} | {s.default_cell()} |" for s in rows]
    lines.append(TABLE_END)
    return "\n".join(lines) + "\n"


def replace_table(document: str) -> str:
    """`document` with the text between the table markers replaced by `markdown()`."""
    begin, end = document.find(TABLE_BEGIN), document.find(TABLE_END)
    if begin < 0 or end < begin:
        raise ValueError(f"the document has no {TABLE_BEGIN!r} ... {TABLE_END!r} section")
    return document[:begin] + markdown() + document[end + len(TABLE_END) + 1:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m partkeeper.config",
                                     description="The configuration reference.")
    parser.add_argument("--markdown", action="store_true", help="print the reference table")
    parser.add_argument("--update", type=Path, metavar="DOC",
                        help="rewrite the table in DOC (docs/configuration.md) in place")
    args = parser.parse_args(argv)
    if args.update is not None:
        args.update.write_text(replace_table(args.update.read_text()))
    elif args.markdown:
        sys.stdout.write(markdown())
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
