#!/usr/bin/env bash
# Install onnxruntime-node 1.30.0 into a cache outside the source tree, once.
# The last line on stdout is the node_modules path to export as BNFOLD_ORT_NODE_MODULES; everything else goes
# to stderr. A second run only checks that the module loads and does not touch the network.
#
# Usage: scripts/ort/ensure_ort.sh
# Cache: ${BNFOLD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bnfold}/ort-node-1.30.0
set -euo pipefail

readonly ORT_VERSION=1.30.0
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly SCRIPT_DIR
if [[ -z "${BNFOLD_CACHE_DIR:-}" && -z "${XDG_CACHE_HOME:-}" && -z "${HOME:-}" ]]; then
    printf 'ensure_ort: error: none of BNFOLD_CACHE_DIR, XDG_CACHE_HOME, HOME is set: no place for the cache\n' >&2
    exit 1
fi
readonly CACHE_BASE="${BNFOLD_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-}/.cache}/bnfold}"
readonly INSTALL_DIR="$CACHE_BASE/ort-node-$ORT_VERSION"
readonly NODE_MODULES="$INSTALL_DIR/node_modules"

log() { printf 'ensure_ort: %s\n' "$*" >&2; }
die() { printf 'ensure_ort: error: %s\n' "$*" >&2; exit 1; }

# Loading the module (not just finding the folder) catches half-finished installs and a missing native binary.
ort_loads() {
    node -e '
        const dir = process.argv[1];
        require(dir + "/onnxruntime-node");
        const version = require(dir + "/onnxruntime-node/package.json").version;
        if (version !== process.argv[2]) throw new Error("found onnxruntime-node " + version);
    ' "$NODE_MODULES" "$ORT_VERSION" >/dev/null 2>&1
}

command -v node >/dev/null 2>&1 || die "node not found on PATH (run scripts/setup_deps.sh)"

if ort_loads; then
    printf '%s\n' "$NODE_MODULES"
    exit 0
fi

command -v npm >/dev/null 2>&1 || die "npm not found on PATH (run scripts/setup_deps.sh)"
mkdir -p "$INSTALL_DIR" || die "cannot create $INSTALL_DIR"

# Several test processes may call this at once: serialise the install and re-check after taking the lock.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$INSTALL_DIR/.install.lock"
    flock 9
    if ort_loads; then
        printf '%s\n' "$NODE_MODULES"
        exit 0
    fi
fi

log "installing onnxruntime-node $ORT_VERSION into $INSTALL_DIR"
cp "$SCRIPT_DIR/package.json" "$INSTALL_DIR/package.json" || die "cannot copy package.json to $INSTALL_DIR"
# --ignore-scripts: the package's postinstall only fetches GPU providers; the CPU runtime ships in the tarball.
if ! (cd "$INSTALL_DIR" && npm install --ignore-scripts --no-audit --no-fund --no-update-notifier \
        --loglevel=error 1>&2); then
    die "npm install of onnxruntime-node $ORT_VERSION into $INSTALL_DIR failed (see npm's output above)"
fi

ort_loads || die "onnxruntime-node $ORT_VERSION was installed into $INSTALL_DIR but does not load: try: node -e 'require(\"$NODE_MODULES/onnxruntime-node\")'"
log "installed onnxruntime-node $ORT_VERSION"
printf '%s\n' "$NODE_MODULES"
