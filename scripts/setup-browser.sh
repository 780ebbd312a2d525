#!/usr/bin/env bash
# The browser the web page's tests drive: Debian's chromium (Playwright cannot download its own
# here) and a CJK font so Chinese text renders as glyphs, not boxes. Idempotent and quiet: does
# nothing when both are installed, runs apt-get update only when chromium is missing.
set -euo pipefail
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
dpkg-query -W -f='${Status}' fonts-wqy-microhei 2>/dev/null | grep -q "install ok installed" \
    || need+=(fonts-wqy-microhei)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ ! -x /usr/bin/chromium ]; then
    $SUDO apt-get update -qq >/dev/null
fi
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
