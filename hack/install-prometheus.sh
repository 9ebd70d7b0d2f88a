#!/usr/bin/env bash
# Installs Prometheus and promtool (github.com/prometheus/prometheus, built from the Go module proxy) into
# the machine-wide cache that survives fresh clones, for the chart's alert rules (`promtool check rules`,
# `promtool test rules`) and the e2e that scrapes the local node. Idempotent: does nothing when the cache
# holds this version; a version bump rebuilds and prunes the old one.
#
#   hack/install-prometheus.sh             install what is missing, then write <cache>/prometheus.env
#   hack/install-prometheus.sh --print-env also print prometheus.env (PROMETHEUS_BIN=..., PROMTOOL_BIN=...)
#
# Cache: ${VGPUD_CACHE:-$HOME/.cache/vgpud}. A cold run (empty Go caches) downloads the module's
# dependencies and compiles promtool in about 4.5 minutes on 2 cores, then prometheus in about 1 more.
# The module build has no web UI assets (the UI is an npm build): the server's API, which the tests use,
# is complete.
set -euo pipefail

# the Go module's versions are v0.<major><minor>.<patch>: v0.316.0 is Prometheus 3.16.0
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
CACHE=${VGPUD_CACHE:-$HOME/.cache/vgpud}

print_env=0
for arg in "$@"; do
  case $arg in
    --print-env) print_env=1 ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-prometheus: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

say() { echo "install-prometheus: $*" >&2; }

mkdir -p "$CACHE"
exec 9>"$CACHE/.install-prometheus.lock"
flock 9
rm -rf "$CACHE/.prometheus.tmp"  # what an interrupted run left (we hold the lock)

DIR=$CACHE/prometheus-$PROMETHEUS_VERSION
if [ ! -x "$DIR/prometheus" ] || [ ! -x "$DIR/promtool" ]; then
  for cmd in promtool prometheus; do
    say "building github.com/prometheus/prometheus/cmd/$cmd@$PROMETHEUS_VERSION"
    GOBIN=$CACHE/.prometheus.tmp GOTOOLCHAIN=local CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
      "github.com/prometheus/prometheus/cmd/$cmd@$PROMETHEUS_VERSION"
  done
  "$CACHE/.prometheus.tmp/promtool" --help > /dev/null
  mkdir -p "$DIR" && mv "$CACHE/.prometheus.tmp/prometheus" "$CACHE/.prometheus.tmp/promtool" "$DIR/"
  rm -rf "$CACHE/.prometheus.tmp"
  for old in "$CACHE"/prometheus-v*; do
    [ "$old" = "$DIR" ] || rm -rf "$old"
  done
fi

env_file=$CACHE/prometheus.env
printf 'PROMETHEUS_VERSION=%s\nPROMETHEUS_BIN=%s\nPROMTOOL_BIN=%s\n' \
  "$PROMETHEUS_VERSION" "$DIR/prometheus" "$DIR/promtool" > "$env_file.tmp"
mv "$env_file.tmp" "$env_file"
[ "$print_env" = 1 ] && cat "$env_file"
exit 0
