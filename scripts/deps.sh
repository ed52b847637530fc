#!/usr/bin/env bash
# Installs the Debian 12 packages kiln builds with, when missing (needs root or sudo; no-op when all present).
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config libpcre2-dev libgtest-dev libgmock-dev nlohmann-json3-dev libcpp-httplib-dev xz-utils python3-jinja2)
# --fuzz: the libFuzzer toolchain; --browser: Chromium for the chat page's headless test (CI passes both).
for flag in "$@"; do
  case "$flag" in
    --fuzz) pkgs+=(clang libclang-rt-14-dev) ;;
    --browser) pkgs+=(chromium) ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "kiln: installing ${missing[*]}" >&2
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
