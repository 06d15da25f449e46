#!/usr/bin/env bash
# Installs what m3 builds and tests with: Debian packages (as root; otherwise it says which
# are missing) and the npm test peers pinned in package-lock.json (into ./node_modules).
# usage: scripts/deps.sh [--build-only]   (--build-only: just what building m3 needs)
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
[ "${1:-}" = --build-only ] && build_only=1
pkgs="build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libevent-dev libpng-dev libjpeg-dev libwebp-dev"
if [ $build_only = 0 ]; then
  pkgs="$pkgs python3 clang libclang-rt-14-dev"
  command -v npm >/dev/null 2>&1 || pkgs="$pkgs nodejs npm"
fi
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages:$missing (run as root or: sudo apt-get install$missing)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# test peers (Hugging Face-compatible tokenizers, the jinja renderer, tiktoken, openai)
[ $build_only = 1 ] && exit 0
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
