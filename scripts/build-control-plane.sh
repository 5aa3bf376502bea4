#!/usr/bin/env bash
# Build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, the
# LeaderWorkerSet controller and Prometheus Adapter from Go modules (module proxy only, no tarballs) into
# $TPUSERVE_K8S_BIN, a directory keyed by the pinned versions. A no-op when every binary
# exists AND its embedded Go build info (`go version -m`) names the pinned module version.
#
# Usage: scripts/build-control-plane.sh [--check]
#   --check  only report whether the binaries are present and current (exit 1 if not).
# Env: TPUSERVE_BUILD_JOBS (go build -p, default 2), TPUSERVE_CACHE (see scripts/tool-paths.sh).
# Recipe and reasons: docs/development.md and the control-plane reference (k8s wrapper module
# with staging replaces generated from the served go.mod, version ldflags).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/tool-paths.sh

check_only=0
[ "${1:-}" = "--check" ] && check_only=1

log() { printf '[build-control-plane] %s\n' "$*" >&2; }

# `go version -m BIN` prints the module a binary was built from (path line + mod/dep lines).
# A binary is current when its build info lists MODULE at VERSION.
built_from() { # BIN MODULE VERSION
  [ -x "$1" ] || return 1
  command -v go >/dev/null 2>&1 || { [ -x "$1" ] && return 0; }
  go version -m "$1" 2>/dev/null | awk -v m="$2" -v v="$3" \
    '($1=="mod"||$1=="dep") && $2==m && $3==v {found=1} END {exit found?0:1}'
}

k8s_current() {
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    built_from "$TPUSERVE_K8S_BIN/$b" k8s.io/kubernetes "$TPUSERVE_K8S_VERSION" || return 1
  done
}
etcd_current() { built_from "$TPUSERVE_K8S_BIN/etcd" go.etcd.io/etcd/server/v3 "$TPUSERVE_ETCD_VERSION"; }
kwok_current() { built_from "$TPUSERVE_K8S_BIN/kwok" sigs.k8s.io/kwok "$TPUSERVE_KWOK_VERSION"; }
lws_current() { built_from "$TPUSERVE_K8S_BIN/lws-controller" sigs.k8s.io/lws "$TPUSERVE_LWS_VERSION"; }
adapter_current() {
  built_from "$TPUSERVE_K8S_BIN/prometheus-adapter" sigs.k8s.io/prometheus-adapter \
    "$TPUSERVE_PROMETHEUS_ADAPTER_VERSION"
}

if [ "$check_only" = 1 ]; then
  ok=0
  for part in k8s etcd kwok lws adapter; do
    if "${part}_current"; then log "$part: current"; else log "$part: missing or stale"; ok=1; fi
  done
  exit "$ok"
fi

if k8s_current && etcd_current && kwok_current && lws_current && adapter_current; then
  log "all binaries current in $TPUSERVE_K8S_BIN (nothing to do)"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  # Without Go the e2e tests skip (saying how to enable them), except under CI where they
  # must run: there a missing Go is an error.
  if [ "${CI:-}" = true ]; then
    log "ERROR: the Go toolchain (go 1.26+) is needed to build the control plane (CI=true)."
    exit 1
  fi
  log "WARNING: Go (1.26+) is not on PATH, so the control plane cannot be built; the e2e tests"
  log "will skip. Install Go and run scripts/build-control-plane.sh (make test does this)."
  exit 0
fi

export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
jobs=${TPUSERVE_BUILD_JOBS:-2}
build_root=$TPUSERVE_CACHE/k8s/build
mkdir -p "$TPUSERVE_K8S_BIN" "$build_root"
start_all=$(date +%s)

# Fresh wrapper module in DIR (go.mod written by the caller or `go mod init`).
wrapper() { # DIR NAME
  mkdir -p "$1"
  (cd "$1" && { [ -f go.mod ] || go mod init "local.test/$2" >/dev/null 2>&1; })
}

# Make go.mod.new (in the current directory) the module's go.mod when it differs from the one
# generated last time (go.mod.gen); go.sum goes with a changed go.mod and is resolved afresh.
adopt_go_mod() {
  if ! cmp -s go.mod.new go.mod.gen 2>/dev/null; then
    cp go.mod.new go.mod
    cp go.mod.new go.mod.gen
    rm -f go.sum
  fi
  rm -f go.mod.new
}

# Install OUT atomically from a temporary build output.
install_bin() { # SRC DEST
  chmod 0755 "$1"
  mv -f "$1" "$2"
}

build_k8s() {
  local w=$build_root/k8s-$TPUSERVE_K8S_VERSION stg minor modfile go_line godebug_line staging
  stg="v0.${TPUSERVE_K8S_VERSION#v1.}"
  minor=$(cut -d. -f2 <<<"$TPUSERVE_K8S_VERSION")
  mkdir -p "$w"
  cd "$w"
  [ -f go.mod ] || go mod init local.test/k8s-bins >/dev/null 2>&1
  modfile=$(go mod download -json "k8s.io/kubernetes@$TPUSERVE_K8S_VERSION" |
    python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  go_line=$(grep -E '^go [0-9]' "$modfile")
  godebug_line=$(grep -E '^godebug ' "$modfile" || true)
  # Staging modules: every `k8s.io/X => ./staging/...` line of the served go.mod.
  staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$modfile")
  {
    echo "module local.test/k8s-bins"
    echo
    echo "$go_line"
    [ -n "$godebug_line" ] && echo "$godebug_line"
    echo
    echo "require k8s.io/kubernetes $TPUSERVE_K8S_VERSION"
    echo
    echo "replace ("
    for m in $staging; do printf '\t%s => %s %s\n' "$m" "$m" "$stg"; done
    echo ")"
  } >go.mod.new
  adopt_go_mod
  local p=k8s.io/kubernetes/cmd
  go get "$p/kube-apiserver@$TPUSERVE_K8S_VERSION" "$p/kube-controller-manager@$TPUSERVE_K8S_VERSION" \
    "$p/kube-scheduler@$TPUSERVE_K8S_VERSION"
  # Same keys as upstream hack/lib/version.sh, so /version reports the real release.
  local ldf="-s -w" now pkg
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $pkg.gitVersion=$TPUSERVE_K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldf+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$now"
  done
  local tmp
  tmp=$(mktemp -d "$build_root/out.XXXXXX")
  nice -n 10 go build -p "$jobs" -trimpath -tags=selinux,notest -ldflags="$ldf" -o "$tmp/" \
    "$p/kube-apiserver" "$p/kube-controller-manager" "$p/kube-scheduler"
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    install_bin "$tmp/$b" "$TPUSERVE_K8S_BIN/$b"
  done
  rmdir "$tmp"
  "$TPUSERVE_K8S_BIN/kube-apiserver" --version >&2
}

build_etcd() {
  local w=$build_root/etcd-$TPUSERVE_ETCD_VERSION tmp
  wrapper "$w" etcd-bin
  cd "$w"
  go get "go.etcd.io/etcd/server/v3@$TPUSERVE_ETCD_VERSION"
  tmp=$(mktemp -d "$build_root/out.XXXXXX")
  # The module root of go.etcd.io/etcd/server/v3 is etcd's main package (main.go).
  nice -n 10 go build -p "$jobs" -trimpath -ldflags="-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
  install_bin "$tmp/etcd" "$TPUSERVE_K8S_BIN/etcd"
  rmdir "$tmp"
  "$TPUSERVE_K8S_BIN/etcd" --version >&2
}

# kwok's go.mod has no replace directives, so `go install module/pkg@version` works.
build_kwok() {
  local tmp
  tmp=$(mktemp -d "$build_root/out.XXXXXX")
  (cd "$tmp" && GOBIN="$tmp" nice -n 10 go install -p "$jobs" -trimpath -ldflags="-s -w" \
    "sigs.k8s.io/kwok/cmd/kwok@$TPUSERVE_KWOK_VERSION")
  install_bin "$tmp/kwok" "$TPUSERVE_K8S_BIN/kwok"
  rmdir "$tmp"
}

build_lws() {
  # Not `go install sigs.k8s.io/lws/cmd@VERSION`: that also reads the module's version list
  # (for deprecation notices), which the proxy refuses for sigs.k8s.io/lws (403). A wrapper
  # module requiring the pinned version resolves the same dependency graph without it.
  local w=$build_root/lws-$TPUSERVE_LWS_VERSION tmp modfile go_line
  mkdir -p "$w"
  cd "$w"
  modfile=$(go mod download -json "sigs.k8s.io/lws@$TPUSERVE_LWS_VERSION" |
    python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  go_line=$(grep -E '^go [0-9]' "$modfile")
  printf 'module local.test/lws-bin\n\n%s\n\nrequire sigs.k8s.io/lws %s\n' \
    "$go_line" "$TPUSERVE_LWS_VERSION" >go.mod.new
  adopt_go_mod
  tmp=$(mktemp -d "$build_root/out.XXXXXX")
  # LWS's main package is sigs.k8s.io/lws/cmd; its version variables are in pkg/version.
  nice -n 10 go build -p "$jobs" -trimpath \
    -ldflags="-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$TPUSERVE_LWS_VERSION" \
    -o "$tmp/lws-controller" sigs.k8s.io/lws/cmd
  install_bin "$tmp/lws-controller" "$TPUSERVE_K8S_BIN/lws-controller"
  rmdir "$tmp"
  "$TPUSERVE_K8S_BIN/lws-controller" --version >&2
}

build_adapter() {
  # A wrapper module, as for LWS: the proxy refuses sigs.k8s.io/prometheus-adapter's version
  # list (403), which `go install module/pkg@version` reads.
  local w=$build_root/prometheus-adapter-$TPUSERVE_PROMETHEUS_ADAPTER_VERSION tmp
  mkdir -p "$w"
  cd "$w"
  printf 'module local.test/prometheus-adapter-bin\n\ngo 1.26\n\nrequire sigs.k8s.io/prometheus-adapter %s\n' \
    "$TPUSERVE_PROMETHEUS_ADAPTER_VERSION" >go.mod.new
  adopt_go_mod
  tmp=$(mktemp -d "$build_root/out.XXXXXX")
  nice -n 10 go build -p "$jobs" -trimpath -ldflags="-s -w" \
    -o "$tmp/prometheus-adapter" sigs.k8s.io/prometheus-adapter/cmd/adapter
  install_bin "$tmp/prometheus-adapter" "$TPUSERVE_K8S_BIN/prometheus-adapter"
  rmdir "$tmp"
}

timed() { # PART
  local t0=$SECONDS
  if "${1}_current"; then
    log "$1: current"
    return 0
  fi
  log "$1: building"
  ("build_$1")
  "${1}_current" || { log "ERROR: $1 built but its build info does not match the pinned version"; return 1; }
  log "$1: built in $((SECONDS - t0)) s"
}

# etcd and kwok first: small, and they give early feedback on the toolchain and the proxy.
timed etcd
timed kwok
timed k8s
# Build an optional PART as a job (so that `set -e` still applies inside it): a failure only
# warns that WHAT did not build and which e2e test will skip; under CI=true nothing may skip,
# so there it is an error.
optional() { # PART WHAT SKIPPED
  timed "$1" &
  if ! wait $!; then
    if [ "${CI:-}" = true ]; then
      log "ERROR: $2 did not build (CI=true)"
      exit 1
    fi
    log "WARNING: $2 did not build; $3 will skip"
  fi
}
# LWS is optional for local work (the StatefulSet path covers multi-host without it).
optional lws "the LWS controller" "the LWS e2e test"
# Prometheus Adapter serves the engines' series to the HPA (only the autoscaling e2e test
# needs it).
optional adapter "Prometheus Adapter" "the autoscaling e2e test"
log "done in $(($(date +%s) - start_all)) s; binaries in $TPUSERVE_K8S_BIN"
