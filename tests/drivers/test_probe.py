"""`partkeeper probe`: read-only, over the C NVML through the normal library lookup, with no
library at all, and on the sim driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml
from fakes import nvml as nv
from fakes.nvml import FakeNvml

from partkeeper.drivers.base import InstanceSpec
from partkeeper.drivers.nvidia.binding import NvmlDriver
from tests_support.drivers import probe

MUTATING = (
    "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy", "nvmlDeviceSetMigMode",
)  # fmt: skip


def test_probe_over_nvml_shows_cards_profiles_and_instances_and_changes_nothing(
    fake_nvml: FakeNvml,
) -> None:
    driver = NvmlDriver()
    inst = driver.create(InstanceSpec(0, "1g.10gb", 3))
    fake_nvml.set_processes(inst.uuid, 2)
    before = {fn: fake_nvml.calls(fn) for fn in MUTATING}
    result = probe({**fake_nvml.env(), "PK_DRIVER": "nvml"}, "--json")
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)
    assert view["driver"] == "nvml"
    h100, a100 = view["cards"][0], view["cards"][1]
    assert (h100["model"], h100["mig"], h100["matches_tables"]) == (
        "H100-80GB", {"current": True, "pending": True}, True)
    p1 = next(p for p in a100["profiles"] if p["name"] == "1g.10gb")
    assert p1["nvml_id"] == 15
    assert p1["nvml_profile"] == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    assert p1["placements"] == [[0, 2], [2, 2], [4, 2], [6, 2]] and p1["matches"] is True
    [listed] = h100["instances"]
    assert (listed["uuid"], listed["start"], listed["processes"]) == (inst.uuid, 3, 2)
    assert view["cards"][3]["mode"] == "sliced" and view["cards"][3]["mig"]["current"] is False
    assert {fn: fake_nvml.calls(fn) for fn in MUTATING} == before  # read-only


def test_probe_reports_a_card_that_disagrees_with_the_tables(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_profile(2, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, (0,), 2)
    result = probe({**fake_nvml.env(), "PK_DRIVER": "nvml"})
    assert result.returncode == 0, result.stderr
    assert "card 2 NVIDIA H200" in result.stdout
    assert "REFUSED: H200-141GB: 7g.141gb" in result.stdout


def test_probe_without_a_library_is_one_sentence_and_a_non_zero_exit(tmp_path: Path) -> None:
    # An empty file first on the search path ends the loader's search with an error, so this
    # holds on a machine with a real libnvidia-ml.so.1 too.
    (tmp_path / "libnvidia-ml.so.1").write_bytes(b"")
    env = {"PK_DRIVER": "nvml", "LD_LIBRARY_PATH": str(tmp_path), "FAKE_NVML_STATE": ""}
    for args in ((), ("--json",)):
        result = probe(env, *args)
        assert result.returncode == 2 and result.stdout == ""
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
        assert "libnvidia-ml.so.1" in result.stderr


def test_probe_on_the_sim_driver(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    env = {"PK_DRIVER": "sim", "PK_SIM_STATE": str(state)}
    missing = probe(env, "--json")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert str(state) in missing.stderr and missing.stderr.count("\n") == 1
    cli = [sys.executable, "-m", "partkeeper", "sim"]
    subprocess.run([*cli, "init", "--state", str(state), "--cards", "A100-40GB", "--sliced",
                    "H100-80GB"], check=True, capture_output=True, timeout=60)
    subprocess.run([*cli, "carve", "--state", str(state), "--card", "0", "--profile", "3g.20gb"],
                   check=True, capture_output=True, timeout=60)
    result = probe(env, "--json")
    assert result.returncode == 0, result.stderr
    a100, sliced = json.loads(result.stdout)["cards"]
    assert a100["matches_tables"] and a100["instances"][0]["profile"] == "3g.20gb"
    assert {p["name"] for p in a100["profiles"]} >= {"1g.5gb", "7g.40gb"}
    assert sliced["mode"] == "sliced" and sliced["profiles"] == []


def test_probe_reports_a_profile_without_placements(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_placements(0, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
                             nv.ERROR_NOT_SUPPORTED)
    result = probe({**fake_nvml.env(), "PK_DRIVER": "nvml"})
    assert result.returncode == 0, result.stderr
    assert "profile 1g.10gb+me nvml id 20: 1 max, starts none (NVML: Not Supported)" in (
        result.stdout)
    assert "card 0 H100-80GB" in result.stdout and "matches the tables" in result.stdout


def _check_env(fake: FakeNvml, tmp_path: Path) -> dict[str, str]:
    return {**fake.env(), "PK_DRIVER": "nvml", "PK_DRIVER_ROOT": str(tmp_path / "root"),
            "PK_PROC_ROOT": str(tmp_path / "proc")}


def test_check_shows_versions_capabilities_and_the_nodes_a_reply_would_name(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    """The first run on a GPU, read-only: nothing created, no node made, every path shown."""
    driver = NvmlDriver(root=tmp_path / "root", proc_root=tmp_path / "proc")
    inst = driver.create(InstanceSpec(0, "7g.80gb", 0))  # GI 0
    before = {fn: fake_nvml.calls(fn) for fn in MUTATING}
    result = probe(_check_env(fake_nvml, tmp_path), "--check", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["versions"] == {"driver": "550.54.15", "nvml": "12.550.54.15"}
    assert report["mutate"] is None
    [part] = report["cards"][0]["partitions"]
    assert (part["uuid"], part["gi_id"]) == (inst.uuid, 0)
    gi_file, ci_file = part["capability_files"]
    assert gi_file["path"].endswith("capabilities/gpu0/mig/gi0/access") and gi_file["present"]
    assert "DeviceFileMinor: 3" in gi_file["text"] and ci_file["path"].endswith("gi0/ci0/access")
    caps = [n for n in part["nodes"] if "nvidia-caps" in n["container_path"]]
    assert [(n["container_path"], n["device"], n["state"]) for n in caps] == [
        ("/dev/nvidia-caps/nvidia-cap3", "235:3", "missing"),
        ("/dev/nvidia-caps/nvidia-cap4", "235:4", "missing")]
    assert not (tmp_path / "root/dev/nvidia-caps").exists()  # read-only: no node made
    assert {fn: fake_nvml.calls(fn) for fn in MUTATING} == before
    text = probe(_check_env(fake_nvml, tmp_path), "--check")
    assert "NVML 12.550.54.15, driver 550.54.15" in text.stdout
    assert "reply names /dev/nvidia-caps/nvidia-cap3 <- " in text.stdout
    assert "read-only: nothing created" in text.stdout


def test_check_mutate_asks_a_second_session_and_leaves_the_card_as_it_was(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    driver = NvmlDriver()
    kept = driver.create(InstanceSpec(0, "1g.10gb", 0))
    result = probe(_check_env(fake_nvml, tmp_path), "--check", "--mutate", "--json")
    assert result.returncode == 0, result.stderr
    mutate = json.loads(result.stdout)["mutate"]
    assert mutate["spec"] == "card 0 1g.10gb at 1"  # the first free 1-slice spot
    assert mutate["second_session_before"] == [kept.uuid]
    assert mutate["second_session_sees_create"] and mutate["second_session_sees_destroy"]
    assert mutate["uuid_from"] == "ci handle"
    made = [n["state"] for n in mutate["nodes"] if "nvidia-caps" in n["host_path"]]
    if mutate["nodes_problem"]:  # a process without CAP_MKNOD: the refusal a reply would be
        assert made == [] and "the allocator needs CAP_MKNOD" in mutate["nodes_problem"]
    else:
        assert made == ["ok", "ok"]  # made as a reply makes them
    assert driver.instances(0) == [kept]  # destroyed again
    assert fake_nvml.calls("nvmlGpuInstanceDestroy") == 1


def test_check_is_nvml_only_and_mutate_needs_check(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    alone = probe(_check_env(fake_nvml, tmp_path), "--mutate")
    assert alone.returncode == 64 and "--mutate goes with --check" in alone.stderr
    sim = probe({"PK_DRIVER": "sim", "PK_SIM_STATE": str(tmp_path / "sim.json")}, "--check")
    assert sim.returncode == 64 and "--check reads NVML; PK_DRIVER is sim" in sim.stderr
    assert fake_nvml.calls("nvmlDeviceCreateGpuInstanceWithPlacement") == 0


def test_gpu_check_script_runs_read_only_without_the_node_tools(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    """bench/gpu_check.sh on a node without nvidia-smi (here: the fake's): each missing tool is
    a line, the check itself runs, and nothing is created."""
    script = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.sh"
    env = {**os.environ, **_check_env(fake_nvml, tmp_path), "PYTHON": sys.executable,
           "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "(nvidia-smi not found)" in out or "== nvidia-smi" in out
    assert "235 nvidia-caps" in out  # the fake's /proc/devices
    assert "NVML 12.550.54.15, driver 550.54.15" in out and "read-only: nothing created" in out
    assert fake_nvml.calls("nvmlDeviceCreateGpuInstanceWithPlacement") == 0
    bad = subprocess.run(["bash", str(script), "--force"], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode == 64


def test_check_says_no_where_a_second_session_missed_a_change() -> None:
    """What a stale session (the public report) and a refused hand-over read as."""
    from partkeeper.drivers.nvidia.check import render

    report = {"versions": {"nvml": "12.550.54.15", "driver": "550.54.15"}, "cards": [],
              "mutate": {"spec": "card 0 1g.10gb at 1", "uuid": "MIG-x", "uuid_from": "walk",
                         "nodes": [], "nodes_problem": "cannot create /dev/nvidia-caps/x",
                         "second_session_sees_create": True,
                         "second_session_sees_destroy": False}}
    lines = render(report)
    assert "--mutate: created card 0 1g.10gb at 1: MIG-x (UUID from the walk)" in lines
    assert "  the reply would be refused: cannot create /dev/nvidia-caps/x" in lines
    assert lines[-1] == "  a second NVML session sees the create: yes, and the destroy: NO"


def test_probe_shows_a_failed_and_a_lost_card_and_keeps_listing(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    env = {"PK_DRIVER": "sim", "PK_SIM_STATE": str(state)}
    cli = [sys.executable, "-m", "partkeeper", "sim"]
    subprocess.run([*cli, "init", "--state", str(state), "--cards", "H100-80GB,A100-40GB"],
                   check=True, capture_output=True, timeout=60)
    for card, xid in ((0, 48), (1, 79)):
        subprocess.run([*cli, "fail", "--state", str(state), "--card", str(card), "--xid",
                        str(xid)], check=True, capture_output=True, timeout=60)
    result = probe(env, "--json")
    assert result.returncode == 0, result.stderr
    failed, lost = json.loads(result.stdout)["cards"]
    assert (failed["health"], failed["xids"], failed["matches_tables"]) == ("failed", [48], True)
    assert (lost["health"], lost["problem"], lost["instances"]) == (
        "lost", "lost: GPU is lost", [])
    text = probe(env).stdout
    assert "FAILED: fatal XID(s) 48" in text
    assert "card 1 LOST: GPU is lost" in text
