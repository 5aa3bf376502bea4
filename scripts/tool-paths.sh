# Sourced by scripts: where cached tools live. One cache per machine, shared by every clone,
# so CI reuses what an earlier run built.
export TPUSERVE_CACHE=${TPUSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuserve}
export TPUSERVE_TOOLS_BIN=$TPUSERVE_CACHE/tools/bin
export PATH=$TPUSERVE_TOOLS_BIN:$PATH
# Control-plane binaries (scripts/build-control-plane.sh), keyed by the pinned versions so a
# version bump builds into a fresh directory and old builds stay usable until then.
export TPUSERVE_K8S_VERSION=${TPUSERVE_K8S_VERSION:-v1.36.3}
export TPUSERVE_ETCD_VERSION=${TPUSERVE_ETCD_VERSION:-v3.6.16}
export TPUSERVE_KWOK_VERSION=${TPUSERVE_KWOK_VERSION:-v0.8.0}
# LWS v0.10.0 is pinned upstream by the reference, but the module proxy answers 403 "This module
# version is not available" for its zip (and for @v/list); v0.9.0 (go 1.26, k8s.io v0.36.2) is served.
export TPUSERVE_LWS_VERSION=${TPUSERVE_LWS_VERSION:-v0.9.0}
# The metrics adapter the HPA reads the engines' series through (built like LWS; optional, so
# not part of the directory key: a missing one only skips the autoscaling e2e test).
export TPUSERVE_PROMETHEUS_ADAPTER_VERSION=${TPUSERVE_PROMETHEUS_ADAPTER_VERSION:-v0.12.0}
# Data only (nothing is built): the Prometheus Operator's CRDs (PodMonitor, ServiceMonitor,
# PrometheusRule) for a cluster whose pods run, read from the module in the Go cache.
export TPUSERVE_PROMETHEUS_OPERATOR_VERSION=${TPUSERVE_PROMETHEUS_OPERATOR_VERSION:-v0.85.0}
TPUSERVE_K8S_KEY=k8s-$TPUSERVE_K8S_VERSION.etcd-$TPUSERVE_ETCD_VERSION.kwok-$TPUSERVE_KWOK_VERSION.lws-$TPUSERVE_LWS_VERSION
export TPUSERVE_K8S_KEY
export TPUSERVE_K8S_BIN=${TPUSERVE_K8S_BIN:-$TPUSERVE_CACHE/k8s/$TPUSERVE_K8S_KEY/bin}
# KEDA's operator and metrics apiserver: opt-in (scripts/build-keda.sh), not in CI; v2.21.x needs
# Go 1.27.4, so v2.20.2 is the newest this Go builds.
export TPUSERVE_KEDA_VERSION=${TPUSERVE_KEDA_VERSION:-v2.20.2}
