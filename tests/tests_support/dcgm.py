"""A sample of the DCGM exporter's per-MIG-device series, and the PromQL join of
docs/observability.md ("Pods on partitions") evaluated over samples in Python.

The sample is written as the exporter renders it (NVIDIA/dcgm-exporter at d5e5f510a1b6,
internal/pkg/rendermetrics/render_metrics.go, `gpuMetricsFormat`):
`<field>{gpu, UUID, pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID][, hostname]}`.
Where the values come from (internal/pkg/collector/gpu_collector.go, the metric built per
entity, and internal/pkg/deviceinfo/device_info.go, the entity hierarchy walk):
- `UUID`: `mi.DeviceInfo.UUID`, the parent GPU's UUID (the label is `uuid` only with the old
  namespace option), so a MIG device's series name its card, not the MIG device;
- `GPU_I_ID`: `mi.InstanceInfo.Info.NvmlInstanceId`, the GPU instance's NVML id, present only
  on a MIG device's series (`{{if $metric.MigProfile}}`);
- `GPU_I_PROFILE`: the GPU instance's profile name (`setGPUInstanceProfileName`);
- `gpu`: the card's index, `device`: `nvidia<index>`, `modelName`: the card's model;
- `hostname`: the exporter's node (older releases spelt it `Hostname`).
The Pod labels (`pod`, `namespace`, `container`) come from its pod-resources mapping
(internal/pkg/transformation/kubernetes.go) and are absent for a partition that mapping does not
know, which is the case partkeeper's series fills.

The join (`join`) is PromQL's `A * on(UUID, GPU_I_ID) group_left(<extra>) B` with A the
partition series after `label_replace` copied `card_uuid` to `UUID` and `gpu_instance_id` to
`GPU_I_ID`, and B a DCGM field: each A series meets the one B series with the same two labels
and keeps its own labels plus `<extra>` from B; an A series with several B matches is an error,
as PromQL's "many-to-many matching not allowed".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Labels = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Labels
    value: float


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device as the exporter sees it: its card (index, UUID, model) and GPU instance."""

    gpu: int
    card_uuid: str
    model: str
    gpu_instance_id: int
    profile: str


def render(devices: Iterable[MigDevice], field: str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
           value: float = 0.5, hostname: str = "node-1") -> str:
    """The exporter's exposition text of one field for `devices` (see the module docstring)."""
    lines = [f"# HELP {field} Ratio of time the graphics engine is active.",
             f"# TYPE {field} gauge"]
    for d in devices:
        lines.append(
            f'{field}{{gpu="{d.gpu}",UUID="{d.card_uuid}",pci_bus_id="00000000:{d.gpu + 7:02X}:'
            f'00.0",device="nvidia{d.gpu}",modelName="{d.model}",GPU_I_PROFILE="{d.profile}",'
            f'GPU_I_ID="{d.gpu_instance_id}",hostname="{hostname}"}} {value}')
    return "\n".join(lines) + "\n"


def parse(text: str, name: str) -> list[Sample]:
    """The samples named `name` in exposition text, by prometheus-client's parser."""
    return [Sample(s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name]


def label_replace(samples: Sequence[Sample], dst: str, src: str) -> list[Sample]:
    """`label_replace(v, dst, "$1", src, "(.+)")`: `dst` set to `src`'s value where it has one."""
    return [Sample(s.name, {**s.labels, dst: s.labels[src]} if s.labels.get(src) else s.labels,
                   s.value) for s in samples]


def join(many: Sequence[Sample], one: Sequence[Sample], on: Sequence[str],
         extra: Sequence[str] = ()) -> list[Sample]:
    """`many * on(<on>) group_left(<extra>) one` (module docstring)."""
    by_key: dict[tuple[str, ...], Sample] = {}
    for s in one:
        key = tuple(s.labels.get(label, "") for label in on)
        if key in by_key:
            raise ValueError(f"many-to-many matching not allowed: two series on the one side "
                             f"with {dict(zip(on, key, strict=True))}")
        by_key[key] = s
    out: list[Sample] = []
    for s in many:
        match = by_key.get(tuple(s.labels.get(label, "") for label in on))
        if match is None:
            continue
        labels = {k: v for k, v in s.labels.items() if k != "__name__"}
        labels.update({k: match.labels[k] for k in extra if k in match.labels})
        out.append(Sample("", labels, s.value * match.value))
    return out
