#!/usr/bin/env bash
# Build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and LWS from Go
# modules into a cache keyed by versions; a no-op when they exist.
set -euo pipefail
