#!/usr/bin/env bash
# Install Debian's chromium when no chromium is on PATH: tests/cli/test_report.py loads the
# HTML report in it headless (and fails under CI=true without it). Uses sudo when not root.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    echo "ensure_chromium: chromium is missing and neither root nor sudo can install it" >&2
    exit 1
fi
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq chromium
command -v chromium
