#!/usr/bin/env bash
# PostgreSQL 15 with pgvector, for the PostgreSQL store's tests and benchmarks.
#
#   bash scripts/setup-postgres.sh install   # server + pgvector built and installed (idempotent)
#   bash scripts/setup-postgres.sh start     # install, then a throwaway cluster; prints its URL
#   bash scripts/setup-postgres.sh stop      # stop that cluster
#
# pgvector is not packaged for bookworm, so it is built from Debian's own source package of the
# next release (trixie): a deb-src line in its own sources file, 'apt-get source pgvector',
# make, make install against PG 15. Nothing is fetched outside Debian's archive.
# Environment: HINDSIGHT_PG_DIR (cluster directory, default /tmp/hindsight-pg),
# HINDSIGHT_PG_PORT (default 55432).
set -euo pipefail

PG_VERSION=15
PG_BIN="/usr/lib/postgresql/$PG_VERSION/bin"
PG_DIR="${HINDSIGHT_PG_DIR:-/tmp/hindsight-pg}"
PG_PORT="${HINDSIGHT_PG_PORT:-55432}"
BUILD_DIR="${HINDSIGHT_PG_BUILD:-/var/tmp/hindsight-pgvector}"
SHARE="/usr/share/postgresql/$PG_VERSION/extension"

say() { echo "setup-postgres: $*" >&2; }

apt_updated=0
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        # Not fatal for scripts/test.sh: the PostgreSQL tests skip, saying what is missing.
        say "not root: cannot install ${missing[*]}; the PostgreSQL tests will be skipped"
        exit 0
    fi
    if [ "$apt_updated" = 0 ]; then
        apt-get update -qq
        apt_updated=1
    fi
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install() {
    apt_install "postgresql-$PG_VERSION" "postgresql-server-dev-$PG_VERSION" make gcc dpkg-dev
    if [ -f "$SHARE/vector.control" ] && [ -f "/usr/lib/postgresql/$PG_VERSION/lib/vector.so" ]; then
        return 0 # already built: quiet
    fi
    if [ "$(id -u)" != 0 ]; then
        say "not root: cannot build pgvector"
        exit 0
    fi
    local list=/etc/apt/sources.list.d/hindsight-trixie-src.sources
    if [ ! -f "$list" ]; then
        # Source only (Types: deb-src): no trixie binary can be installed by accident.
        cat >"$list" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        apt_updated=0
    fi
    if [ "$apt_updated" = 0 ]; then
        apt-get update -qq
        apt_updated=1
    fi
    local started=$SECONDS
    rm -rf "$BUILD_DIR"
    mkdir -p "$BUILD_DIR"
    (cd "$BUILD_DIR" && apt-get source -qq pgvector >/dev/null 2>&1)
    local src
    src=$(find "$BUILD_DIR" -mindepth 1 -maxdepth 1 -type d -name 'pgvector-*' | head -1)
    [ -n "$src" ] || { say "apt-get source pgvector gave no source tree"; exit 1; }
    # OPTFLAGS="": no -march=native, so the library runs on any host the tree is copied to.
    make -s -C "$src" PG_CONFIG="$PG_BIN/pg_config" OPTFLAGS="" >/dev/null
    make -s -C "$src" PG_CONFIG="$PG_BIN/pg_config" install >/dev/null
    say "built pgvector from $(basename "$src") in $((SECONDS - started)) s"
}

start() {
    install
    if [ ! -f "$PG_DIR/data/PG_VERSION" ]; then
        mkdir -p "$PG_DIR"
        chown postgres: "$PG_DIR"
        # trust on a loopback socket of a throwaway cluster: it holds only test data.
        su postgres -c "$PG_BIN/initdb -A trust -U postgres -E UTF8 --locale=C.UTF-8 -D '$PG_DIR/data'" >/dev/null
    fi
    if ! su postgres -c "$PG_BIN/pg_ctl -D '$PG_DIR/data' status" >/dev/null 2>&1; then
        su postgres -c "$PG_BIN/pg_ctl -D '$PG_DIR/data' -l '$PG_DIR/log' -w -o \"-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off -c synchronous_commit=off -c full_page_writes=off\" start" >/dev/null
    fi
    echo "postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
}

stop() {
    if [ -f "$PG_DIR/data/postmaster.pid" ]; then
        su postgres -c "$PG_BIN/pg_ctl -D '$PG_DIR/data' -m fast -w stop" >/dev/null
    fi
}

case "${1:-start}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    *)
        say "usage: $0 install|start|stop"
        exit 2
        ;;
esac
