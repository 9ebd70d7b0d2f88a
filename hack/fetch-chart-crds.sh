#!/usr/bin/env bash
# Fetches the CRDs of the chart's optional objects, so the chart tests can dry-run them on a real API
# server: cert-manager's Issuer and Certificate (webhook.certManager) and the Prometheus Operator's
# ServiceMonitor (metrics.serviceMonitor) and PrometheusRule (prometheusRule). Both projects ship their
# CRDs as plain YAML inside their Go module zips (deploy/crds/, example/prometheus-operator-crd/), which
# the Go module proxy serves. Idempotent: prints nothing and does nothing when the cache holds these
# versions and files.
#
#   hack/fetch-chart-crds.sh    fetch what is missing, then write <cache>/chart-crds.env (CHART_CRDS_DIR=...)
#
# Cache: ${VGPUD_CACHE:-$HOME/.cache/vgpud}. The module zips (about 45 MB) go to a temporary module cache
# that is removed afterwards; only the four CRD files (about 0.6 MB) are kept.
set -euo pipefail

CERT_MANAGER_VERSION=${CERT_MANAGER_VERSION:-v1.21.2}
PROMETHEUS_OPERATOR_VERSION=${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}  # newest the root module has
CACHE=${VGPUD_CACHE:-$HOME/.cache/vgpud}
DEST=$CACHE/chart-crds-cert-manager-$CERT_MANAGER_VERSION-prometheus-operator-$PROMETHEUS_OPERATOR_VERSION

say() { echo "fetch-chart-crds: $*" >&2; }

write_env() { printf 'CHART_CRDS_DIR=%s\n' "$DEST" >"$CACHE/chart-crds.env"; }

mkdir -p "$CACHE"
# a cache made before a file was added to the list is fetched again
if [ -f "$DEST/.complete" ] && [ -f "$DEST/monitoring.coreos.com_prometheusrules.yaml" ]; then
  write_env
  exit 0
fi

command -v go >/dev/null || { say "go is not installed (the Go toolchain fetches the module zips)"; exit 1; }
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

# module dir: `go mod download -json` prints where the module was unpacked
module_dir() {
  (cd "$work" && GOMODCACHE="$work/mod" GOFLAGS=-modcacherw go mod download -json "$1") |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}

say "cert-manager $CERT_MANAGER_VERSION and prometheus-operator $PROMETHEUS_OPERATOR_VERSION CRDs into $DEST"
cert_manager=$(module_dir "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION")
prometheus_operator=$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")
rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp"
cp "$cert_manager/deploy/crds/cert-manager.io_issuers.yaml" \
  "$cert_manager/deploy/crds/cert-manager.io_certificates.yaml" \
  "$prometheus_operator/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
  "$prometheus_operator/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml" \
  "$DEST.tmp/"
touch "$DEST.tmp/.complete"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
write_env
