#!/usr/bin/env bash
# Installs the Debian packages m3 builds and tests with (needs root; skipped otherwise).
set -euo pipefail
pkgs="build-essential cmake pkg-config libjansson-dev python3"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages:$missing (run as root or: sudo apt-get install$missing)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing >/dev/null
