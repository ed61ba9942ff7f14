#!/usr/bin/env bash
# The stand-in for the Dockerfile's base image, `python:3.11-slim`, made from Debian's packages
# since no image registry is reachable here: a minimal bookworm root with Debian's Python 3.11,
# a venv at /usr/local (where the official image keeps its interpreter and pip installs), and
# this machine's CA bundle, so that pip inside a build reaches the package registry through
# whatever TLS interception this network does. Imported and tagged under the official name; kept
# between runs on one machine (nothing is done when the tag exists; REBUILD=1 makes it again).
set -euo pipefail
TAG=${TAG:-python:3.11-slim}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

if [ -z "${REBUILD:-}" ] && podman image exists "$TAG"; then
  echo "base image $TAG: present"
  exit 0
fi
work=$(mktemp -d /var/tmp/pk-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  echo "base image: debootstrap failed (log above)" >&2
  exit 1
}
chroot "$root" python3 -m venv /usr/local
cp "$CA_BUNDLE" "$root/etc/ssl/certs/ca-certificates.crt"
# pip trusts its own certifi bundle unless told otherwise.
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc \
  "$root"/usr/share/man "$root"/usr/share/info
tar -C "$root" -c . | podman import --quiet \
  --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --message "python:3.11 stand-in: Debian bookworm minbase, venv at /usr/local" \
  - "$TAG" >/dev/null
echo "base image $TAG: built ($(podman image inspect --format '{{.Size}}' "$TAG") bytes)"
