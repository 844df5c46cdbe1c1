#!/usr/bin/env bash
# Headless Chromium for the report's browser test: Debian's package, installed when missing.
# Needs root (CI runs as root); prints why and exits 0 otherwise, and the test then says so.
set -uo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != "0" ]; then
  echo "setup_browser: not root; install Debian's chromium package to run the browser test" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
apt-get install -y -qq chromium >/dev/null 2>&1 || echo "setup_browser: apt-get install chromium failed" >&2
