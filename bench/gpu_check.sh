#!/usr/bin/env bash
# The first run of partkeeper on a MIG-enabled NVIDIA GPU: `bench/gpu_check.sh [--mutate] [--json]`
#
# Read-only unless --mutate. It prints what the node says through its own tools (nvidia-smi, the
# driver's /proc and /dev files), then `partkeeper probe --check`: NVML's versions, each card's
# profiles and placements against the built-in tables, every partition's capability files and the
# device nodes an Allocate reply would name, with what is at each host path. With --mutate it also
# creates one 1-slice partition, hands it over as an Allocate would (making its capability nodes
# under PK_DRIVER_ROOT), asks a second NVML session opened before whether it sees the create and
# the destroy, and destroys it again. Every step has a timeout; the whole run takes well under 5
# minutes. Run it as the allocator runs (root, CAP_MKNOD) on the node, e.g. in the allocator's
# container: `kubectl -n partkeeper exec <pod> -c allocator -- bench/gpu_check.sh`, or from a
# checkout with PYTHON=.venv/bin/python. Its output goes to docs/drivers.md ("First run on a GPU").
set -uo pipefail

export PK_DRIVER=nvml
export PK_DRIVER_ROOT="${PK_DRIVER_ROOT:-/}"
export PK_PROC_ROOT="${PK_PROC_ROOT:-/proc}"
PYTHON="${PYTHON:-python3}"
STEP_SECONDS="${STEP_SECONDS:-60}"

for arg in "$@"; do
    case "$arg" in
        --mutate | --json) ;;
        *) echo "usage: bench/gpu_check.sh [--mutate] [--json]" >&2; exit 64 ;;
    esac
done

section() { printf '\n== %s\n' "$1"; }
run() {  # a node tool that may be missing: say so, go on
    if ! command -v "$1" >/dev/null 2>&1; then echo "($1 not found)"; return 0; fi
    timeout "$STEP_SECONDS" "$@" || echo "($* exited $?)"
}

echo "partkeeper gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), kernel $(uname -r)"
echo "PK_DRIVER_ROOT=$PK_DRIVER_ROOT PK_PROC_ROOT=$PK_PROC_ROOT"

section "nvidia-smi: cards and MIG mode"
run nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,mig.mode.current,mig.mode.pending --format=csv
section "nvidia-smi: GPU-instance profiles and possible placements"
run nvidia-smi mig -lgip
run nvidia-smi mig -lgipp
section "nvidia-smi: GPU and compute instances"
run nvidia-smi mig -lgi
run nvidia-smi mig -lci
section "/proc/devices: the nvidia majors"
grep -n nvidia "$PK_PROC_ROOT/devices" || echo "(no nvidia entry in $PK_PROC_ROOT/devices)"
section "MIG capability files"
caps="$PK_PROC_ROOT/driver/nvidia/capabilities"
if [ -d "$caps" ]; then
    find "$caps" -name access | sort | while read -r f; do
        printf '%s: %s\n' "${f#"$caps"/}" "$(tr '\n' ' ' < "$f")"
    done
else
    echo "($caps missing)"
fi
head -n 12 "$PK_PROC_ROOT/driver/nvidia-caps/mig-minors" 2>/dev/null || echo "(no mig-minors)"
section "capability nodes under the driver root"
ls -ln "${PK_DRIVER_ROOT%/}/dev/nvidia-caps/" 2>/dev/null || echo "(no ${PK_DRIVER_ROOT%/}/dev/nvidia-caps)"
section "partkeeper probe --check $*"
timeout $((STEP_SECONDS * 3)) "$PYTHON" -m partkeeper probe --check "$@"
