#!/usr/bin/env bash
# Runs a real PostgreSQL server (Debian's package) for ctxwin's fleet-store tests: as a non-root
# user, on a private port and data directory under the repository, on loopback only.
# See scripts/README.md.
#
# Usage: scripts/pg-server.sh install|start|stop|status|url|logs
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/.." && pwd)"
readonly script_dir repo_root

readonly PORT="${CTXWIN_PG_PORT:-55432}"
readonly DATA="${CTXWIN_PG_DATA:-$repo_root/target/pg-data}"
readonly RUN_DIR="${CTXWIN_PG_RUN:-$repo_root/target/pg-run}"
readonly OS_USER="${CTXWIN_PG_OS_USER:-ctxwinpg}"
readonly DB="${CTXWIN_PG_DB:-ctxwin}"
readonly ROLE="${CTXWIN_PG_ROLE:-ctxwin}"
readonly PASSWORD="${CTXWIN_PG_PASSWORD:-ctxwin}"
readonly LOG_FILE="$RUN_DIR/postgres.log"

log() { printf 'pg-server: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

url() { printf 'postgres://%s:%s@127.0.0.1:%s/%s\n' "$ROLE" "$PASSWORD" "$PORT" "$DB"; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

# The newest installed server's bin directory (Debian keeps them in /usr/lib/postgresql/N/bin).
bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$dir" ] && [ -x "$dir/pg_ctl" ] || return 1
    printf '%s\n' "$dir"
}

install() {
    if ! bindir >/dev/null; then
        log "installing Debian's postgresql package"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql >&2
    fi
    bindir >/dev/null || die "no PostgreSQL server binaries after install"
}

# The user the server runs as: PostgreSQL refuses to run as root.
run_user() {
    if [ "$(id -u)" != 0 ]; then
        id -un
        return
    fi
    if ! id "$OS_USER" >/dev/null 2>&1; then
        useradd --system --no-create-home --shell /usr/sbin/nologin "$OS_USER"
    fi
    printf '%s\n' "$OS_USER"
}

as_user() {
    local user=$1
    shift
    if [ "$(id -un)" = "$user" ]; then "$@"; else runuser -u "$user" -- "$@"; fi
}

healthy() {
    local bin user
    bin=$(bindir) || return 1
    user=$(run_user)
    as_user "$user" "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" 2>/dev/null
}

start() {
    install
    local bin user
    bin=$(bindir)
    user=$(run_user)
    mkdir -p "$RUN_DIR"
    chown "$user" "$RUN_DIR"
    if healthy; then
        url
        return
    fi
    if [ ! -s "$DATA/PG_VERSION" ]; then
        log "initdb $DATA"
        mkdir -p "$DATA"
        chown "$user" "$DATA"
        chmod 700 "$DATA"
        local pwfile="$RUN_DIR/pw"
        printf '%s\n' "$PASSWORD" >"$pwfile"
        chown "$user" "$pwfile"
        as_user "$user" "$bin/initdb" -D "$DATA" -U "$ROLE" --pwfile="$pwfile" \
            --auth=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >&2 \
            || as_user "$user" "$bin/initdb" -D "$DATA" -U "$ROLE" --pwfile="$pwfile" \
                --auth=scram-sha-256 --encoding=UTF8 --locale=C >&2
        rm -f "$pwfile"
    fi
    log "starting on 127.0.0.1:$PORT"
    # Loopback only, the socket in our run directory (not /var/run/postgresql), fsync kept on:
    # the tests check what survives a SIGKILL of the proxy, not of the database.
    as_user "$user" "$bin/pg_ctl" -D "$DATA" -l "$LOG_FILE" -w -t 60 start \
        -o "-p $PORT -c listen_addresses=127.0.0.1 -k $RUN_DIR -c max_connections=200" >&2 \
        || { tail -n 30 "$LOG_FILE" >&2 || true; die "the server did not start"; }
    if ! PGPASSWORD="$PASSWORD" "$bin/psql" -h 127.0.0.1 -p "$PORT" -U "$ROLE" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
        PGPASSWORD="$PASSWORD" "$bin/createdb" -h 127.0.0.1 -p "$PORT" -U "$ROLE" "$DB"
    fi
    url
}

stop() {
    local bin user
    bin=$(bindir) || return 0
    [ -s "$DATA/postmaster.pid" ] || return 0
    user=$(run_user)
    as_user "$user" "$bin/pg_ctl" -D "$DATA" -m fast -w stop >&2 || true
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) if healthy; then exit 0; else exit 3; fi ;;
    url) url ;;
    logs) tail -n 50 "$LOG_FILE" ;;
    *) die "usage: $0 install|start|stop|status|url|logs" ;;
esac
