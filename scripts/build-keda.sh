#!/usr/bin/env bash
# Build KEDA's operator and metrics apiserver (github.com/kedacore/keda/v2, Go module proxy only)
# into $TPUSERVE_K8S_BIN as keda-operator and keda-adapter. OPT-IN: not part of
# scripts/build-control-plane.sh's default path nor of CI (KEDA links every scaler's cloud SDK;
# see docs/development.md for the time it takes here). A no-op when both binaries exist and their
# embedded build info names the pinned version.
#
# Usage: scripts/build-keda.sh [--check]
# Env: TPUSERVE_KEDA_VERSION (default v2.20.2: the newest that builds on Go 1.26; v2.21.x needs
#      Go 1.27.4), TPUSERVE_BUILD_JOBS (go build -p, default 2), TPUSERVE_CACHE.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/tool-paths.sh

log() { printf '[build-keda] %s\n' "$*" >&2; }

current() {
  local b
  command -v go >/dev/null 2>&1 || return 1
  for b in keda-operator keda-adapter; do
    [ -x "$TPUSERVE_K8S_BIN/$b" ] || return 1
    go version -m "$TPUSERVE_K8S_BIN/$b" 2>/dev/null | awk -v m=github.com/kedacore/keda/v2 \
      -v v="$TPUSERVE_KEDA_VERSION" '($1=="mod"||$1=="dep") && $2==m && $3==v {f=1} END {exit f?0:1}' ||
      return 1
  done
}

if [ "${1:-}" = "--check" ]; then
  if current; then log "keda $TPUSERVE_KEDA_VERSION: current"; exit 0; fi
  log "keda $TPUSERVE_KEDA_VERSION: missing or stale"
  exit 1
fi
if current; then
  log "keda $TPUSERVE_KEDA_VERSION: current in $TPUSERVE_K8S_BIN (nothing to do)"
  exit 0
fi
command -v go >/dev/null 2>&1 || { log "ERROR: Go (1.26+) is needed to build KEDA"; exit 1; }

export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
jobs=${TPUSERVE_BUILD_JOBS:-2}
w=$TPUSERVE_CACHE/k8s/build/keda-$TPUSERVE_KEDA_VERSION
mkdir -p "$w" "$TPUSERVE_K8S_BIN"
cd "$w"
t0=$SECONDS
# KEDA's go.mod pins k8s.io, controller-runtime and Prometheus's libraries with replace
# directives, which a module that requires KEDA does not inherit: copy them (and its go line)
# into the wrapper module, as scripts/build-control-plane.sh does for Kubernetes' staging modules.
modfile=$(go mod download -json "github.com/kedacore/keda/v2@$TPUSERVE_KEDA_VERSION" |
  python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
{
  echo "module local.test/keda-bins"
  echo
  grep -E '^go [0-9]' "$modfile"
  echo
  echo "require github.com/kedacore/keda/v2 $TPUSERVE_KEDA_VERSION"
  echo
  sed -n '/^replace (/,/^)/p' "$modfile"
} >go.mod.new
if ! cmp -s go.mod.new go.mod.gen 2>/dev/null; then
  cp go.mod.new go.mod
  cp go.mod.new go.mod.gen
  rm -f go.sum
fi
rm -f go.mod.new
# The wrapper's graph must match KEDA's own (its go.mod requires everything it builds with).
go get "github.com/kedacore/keda/v2/cmd/operator@$TPUSERVE_KEDA_VERSION" \
  "github.com/kedacore/keda/v2/cmd/adapter@$TPUSERVE_KEDA_VERSION"
log "modules resolved in $((SECONDS - t0)) s"
tmp=$(mktemp -d "$w/../out.XXXXXX")
ldf="-s -w -X github.com/kedacore/keda/v2/version.Version=$TPUSERVE_KEDA_VERSION"
t1=$SECONDS
nice -n 10 go build -p "$jobs" -trimpath -ldflags="$ldf" -o "$tmp/keda-operator" \
  github.com/kedacore/keda/v2/cmd/operator
log "keda-operator built in $((SECONDS - t1)) s"
t1=$SECONDS
nice -n 10 go build -p "$jobs" -trimpath -ldflags="$ldf" -o "$tmp/keda-adapter" \
  github.com/kedacore/keda/v2/cmd/adapter
log "keda-adapter built in $((SECONDS - t1)) s"
for b in keda-operator keda-adapter; do
  chmod 0755 "$tmp/$b"
  mv -f "$tmp/$b" "$TPUSERVE_K8S_BIN/$b"
done
rmdir "$tmp"
current || { log "ERROR: built, but the build info does not name $TPUSERVE_KEDA_VERSION"; exit 1; }
log "keda $TPUSERVE_KEDA_VERSION built in $((SECONDS - t0)) s into $TPUSERVE_K8S_BIN"
