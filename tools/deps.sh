#!/bin/sh
# deps.sh: install the Debian packages flashsale needs, and nothing when they
# are all present (a dpkg query, no network), so `make test` can always call it.
# Usage: tools/deps.sh [extra-package ...]
#
# Redis topologies (Sentinel, Cluster): the sentinels the tests start are
# `redis-server <conf> --sentinel` (the same binary, from redis-server), so
# the redis-sentinel package is not needed -- it would only add a
# redis-sentinel symlink and start a system sentinel on port 26379.
# iproute2: `ip netns`, the hosts of tests/test_hosts.py.
# pgbouncer, haproxy, patroni: PostgreSQL as it runs in production
# (tests/test_pgscale.py, the Patroni scenes).
# redis-tools has redis-cli, whose --cluster create/reshard make and
# reshape the test clusters.
set -eu

PKGS="gcc make pkg-config redis-server redis-tools libhiredis-dev
      libmicrohttpd-dev libjansson-dev libsqlite3-dev sqlite3 curl
      postgresql libpq-dev iproute2 pgbouncer haproxy patroni
      libzookeeper-mt-dev zookeeper default-jre-headless
      libcurl4-openssl-dev etcd-server etcd-client
      python3 python3-redis python3-yaml python3-jsonschema systemd man-db help2man
      prometheus
      chromium $*"

missing=""
for p in $PKGS; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [ "$status" = "installed" ] || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "deps: installing:$missing"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
        echo "deps: need root or sudo to install:$missing" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "deps: done"
