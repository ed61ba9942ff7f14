#!/usr/bin/env bash
# What the container tests need (tests/containers/README.md), installed from the project's own
# files on a Debian bookworm machine, as root: Debian's podman with runc as its OCI runtime and
# debootstrap; podman-compose in the project's venv; and the two base images no registry serves
# here, made locally (kept between runs on one machine). Idempotent. `.ci/run` calls it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export CONTAINERS_CONF="$here/containers.conf"

missing=()
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$tool" >/dev/null 2>&1 \
    || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "containers: installing ${missing[*]} (Debian)"
  apt-get update -qq
  # podman's recommends bring netavark and aardvark-dns: the bridge network and name resolution
  # between the services' containers. runc named first, so that crun is not chosen for podman.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc podman debootstrap >/dev/null
fi
export PATH=$PATH:/usr/sbin:/sbin

# podman-compose 1.x from PyPI (Debian's 1.0.3 predates `up --no-deps` per service and the
# merged `config`); pinned in tests/containers/requirements.txt.
make -C "$root" --no-print-directory .venv/.installed
"$root/.venv/bin/pip" install --quiet -r "$here/requirements.txt"

podman info --format 'podman {{.Version.Version}}: {{.Host.OCIRuntime.Name}}, cgroups {{.Host.CgroupsVersion}} ({{.Host.CgroupManager}}), storage {{.Store.GraphDriverName}}, network {{.Host.NetworkBackend}}'
bash "$here/base-image.sh"
bash "$here/nats-image.sh"
