#!/usr/bin/env bash
# Debian packages shardfeed's build and tests need. Installs only what is missing, and
# only when it can (root, or passwordless sudo); otherwise says what to install.
set -euo pipefail
what=${1:-build}
pkgs=()
need() { dpkg -s "$1" >/dev/null 2>&1 || pkgs+=("$1"); }
command -v gcc >/dev/null 2>&1 || need gcc
command -v make >/dev/null 2>&1 || need make
if [ "$what" = test ]; then
  command -v clang >/dev/null 2>&1 || need clang   # libFuzzer + AddressSanitizer for fuzz/run_smoke.sh
  [ -x /usr/lib/postgresql/15/bin/initdb ] || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need postgresql
  command -v redis-server >/dev/null 2>&1 || need redis-server
  command -v java >/dev/null 2>&1 || need default-jre-headless   # Spark (pyspark) for the runner="spark" tests
fi
[ ${#pkgs[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
  echo "system-deps: please install: ${pkgs[*]} (apt-get install ${pkgs[*]})" >&2; exit 0; fi
echo "system-deps: installing ${pkgs[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
