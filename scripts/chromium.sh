#!/usr/bin/env bash
# Install Debian's Chromium and its WebDriver (for the browser tests: tests/test_view.py) when
# missing. The package lists are refreshed only when installing from the current ones fails.
# Prints the two paths. Usage: scripts/chromium.sh
set -euo pipefail

log() { printf '[chromium] %s\n' "$*" >&2; }

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  command -v apt-get >/dev/null || { log "ERROR: no apt-get: install chromium and chromedriver by hand"; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  log "installing chromium chromium-driver"
  if ! $sudo apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null; then
    $sudo apt-get update -q >/dev/null
    $sudo apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null
  fi
fi
command -v chromium
command -v chromedriver
