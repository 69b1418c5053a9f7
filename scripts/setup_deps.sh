#!/usr/bin/env bash
# Install the Debian 12 packages bnfold needs to build, test and run its scripts.
# Idempotent: checks each package with dpkg-query first and does not touch apt at all when nothing is missing.
#
# Usage: scripts/setup_deps.sh [EXTRA_PACKAGE...]   (extra packages: e.g. clang-14 for the sanitizer build)
set -euo pipefail

readonly REQUIRED_PACKAGES=(
    build-essential cmake pkg-config
    libonnx-dev libprotobuf-dev protobuf-compiler
    libeigen3-dev libcli11-dev libspdlog-dev catch2 nlohmann-json3-dev
    libonnx-testdata python3-onnx python3-numpy
    python3-dev python3-pip python3-setuptools pybind11-dev python3-pybind11 python3-pytest
)

log() { printf 'setup_deps: %s\n' "$*" >&2; }
die() { printf 'setup_deps: error: %s\n' "$*" >&2; exit 1; }

is_installed() {
    # Status is "install ok installed" only for a fully configured package; removed-but-configured
    # ("deinstall ok config-files") or half-installed ones count as missing.
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query not found: this script supports Debian 12 only"
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script supports Debian 12 only"

missing=()
for package in "${REQUIRED_PACKAGES[@]}" "$@"; do
    is_installed "$package" || missing+=("$package")
done

# Node.js may come from another source (nodesource, nvm, ...). Debian's npm conflicts with such installs,
# so look at the commands on PATH rather than at dpkg, and only fall back to Debian's packages if absent.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if ((${#missing[@]} == 0)); then
    log "all dependencies already installed"
    exit 0
fi
log "missing: ${missing[*]}"

sudo_cmd=()
if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "not root and sudo is not available; install as root: ${missing[*]}"
    sudo_cmd=(sudo)
fi

"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update \
    || die "apt-get update failed (network or apt sources problem); nothing was installed"
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
    || die "apt-get install failed for: ${missing[*]}"

still_missing=()
for package in "${missing[@]}"; do
    case "$package" in
        nodejs) command -v node >/dev/null 2>&1 || still_missing+=("$package") ;;
        npm) command -v npm >/dev/null 2>&1 || still_missing+=("$package") ;;
        *) is_installed "$package" || still_missing+=("$package") ;;
    esac
done
((${#still_missing[@]} == 0)) || die "still missing after apt-get install: ${still_missing[*]}"
log "installed: ${missing[*]}"
