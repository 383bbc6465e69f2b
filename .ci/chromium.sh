#!/usr/bin/env bash
# Debian's Chromium and its chromedriver for the report's browser tests (tests/report/site/): installed when
# missing (apt-get, as root), nothing done when both are there. No browser is downloaded from elsewhere. Where
# they cannot be installed (no root, no apt), says so and exits 0: the browser tests skip with that reason.
set -uo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    echo "chromium: $(/usr/bin/chromium --version 2>/dev/null | head -1)"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "chromium: not installed (needs root and apt-get): the browser tests will be skipped" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq >/dev/null && apt-get install -y -qq chromium chromium-driver >/dev/null; then
    echo "chromium: installed $(/usr/bin/chromium --version 2>/dev/null | head -1)"
else
    echo "chromium: apt-get could not install it: the browser tests will be skipped" >&2
fi
exit 0
