#!/usr/bin/env bash
# Real agent clients against `dflash-mlx serve`, in one command (about 5 minutes, most of
# it installing). Claude Code and Codex come from npm, llm and aider from PyPI, into a
# temporary folder. For each client a server starts on 127.0.0.1 with a tiny scripted
# target (examples/clients_target.py, 64K context) that calls one of the client's own
# tools; the client runs it and sends the result back, and the model answers. One
# non-interactive prompt per client. It passes when every client exits 0 and no server
# log line shows a 4xx/5xx or a traceback. Nothing but the package registries is
# contacted; each client's telemetry, update checks and network extras are off.
#
#   examples/clients_check.sh                     # claude codex llm aider
#   CLIENTS="claude codex" examples/clients_check.sh
#   KEEP=1 examples/clients_check.sh              # keep the temporary folder (logs)
#
# Versions (those of the last run; "latest" works too): CLAUDE_CODE_VERSION=2.1.197
# CODEX_VERSION=0.171.0 LLM_VERSION=0.36 AIDER_VERSION=0.86.2. CLIENT_PYTHON picks the
# Python for the clients' virtual environments (aider needs 3.10-3.12).

set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${DFLASH_PYTHON:-$ROOT/.venv/bin/python}
DFLASH=$(dirname "$PY")/dflash-mlx
CLIENT_PYTHON=${CLIENT_PYTHON:-python3}
CLIENTS=${CLIENTS:-claude codex llm aider}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-clients.XXXXXX")
PROJECT=$WORK/project
SERVER_PID=""
declare -A RESULT

cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
say() { printf '%s  %s\n' "$(date +%T)" "$*"; }

install_clients() {
    local npm_pkgs=() want
    for want in $CLIENTS; do
        case $want in
        claude) npm_pkgs+=("@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION:-2.1.197}") ;;
        codex) npm_pkgs+=("@openai/codex@${CODEX_VERSION:-0.171.0}") ;;
        llm) venv llm "llm==${LLM_VERSION:-0.36}" ;;
        aider) venv aider "aider-chat==${AIDER_VERSION:-0.86.2}" ;;
        *) say "unknown client '$want' (claude, codex, llm, aider)"; exit 2 ;;
        esac
    done
    if [ ${#npm_pkgs[@]} -gt 0 ]; then
        say "npm install ${npm_pkgs[*]}"
        timeout 300 npm install --prefix "$WORK/npm" --no-audit --no-fund \
            --loglevel=error "${npm_pkgs[@]}" >"$WORK/npm.log" 2>&1 ||
            { tail -20 "$WORK/npm.log"; exit 1; }
    fi
}

venv() {  # name, requirement: a virtual environment of its own (no resolver fights)
    local spec=${2/==latest/}
    say "pip install $spec"
    timeout 420 "$CLIENT_PYTHON" -m venv "$WORK/$1-venv" &&
        timeout 420 "$WORK/$1-venv/bin/pip" install -q --disable-pip-version-check \
            "$spec" >"$WORK/$1-pip.log" 2>&1 ||
        { tail -20 "$WORK/$1-pip.log"; exit 1; }
}

start_server() {  # client, the tool call its model makes: name, JSON arguments
    local models=$WORK/models/$1
    SERVER_LOG=$WORK/server-$1.log
    "$PY" "$ROOT/examples/clients_target.py" "$models" --call "$2" "$3" >/dev/null ||
        return 1
    "$DFLASH" serve --model "$models/target" --draft "$models/draft" --port 0 \
        --log-level info >"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
    local i
    for i in $(seq 240); do
        URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$SERVER_LOG" | head -1)
        [ -n "$URL" ] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.5
    done
    say "the server did not start:"; tail -20 "$SERVER_LOG"; return 1
}

stop_server() {  # then: no 4xx/5xx, no traceback in its log
    kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=""
    if grep -E '" [45][0-9]{2} |Traceback|ERROR' "$SERVER_LOG"; then
        say "the server log above shows errors"; return 1
    fi
    say "server log: $(grep -c '" 200 ' "$SERVER_LOG") requests, all 200"
}

run_claude() {
    HOME=$WORK/home ANTHROPIC_BASE_URL=$URL ANTHROPIC_API_KEY=local \
        DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 DISABLE_AUTOUPDATER=1 \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
        timeout 300 "$WORK/npm/node_modules/.bin/claude" -p "What does hello.txt say?"
}

run_codex() {
    mkdir -p "$WORK/codex"
    cat >"$WORK/codex/config.toml" <<EOF
model = "local"
model_provider = "dflash"
check_for_update_on_startup = false

[analytics]
enabled = false

[history]
persistence = "none"

[model_providers.dflash]
name = "dflash-mlx"
base_url = "$URL/v1"
wire_api = "responses"
env_key = "DFLASH_MLX_API_KEY"
request_max_retries = 0
stream_max_retries = 0
EOF
    CODEX_HOME=$WORK/codex HOME=$WORK/home DFLASH_MLX_API_KEY=local \
        timeout 300 "$WORK/npm/node_modules/.bin/codex" exec --skip-git-repo-check \
        "What does hello.txt say?" </dev/null
}

run_llm() {
    mkdir -p "$WORK/llm"
    cat >"$WORK/llm/extra-openai-models.yaml" <<EOF
- model_id: dflash
  model_name: local
  api_base: "$URL/v1"
  supports_tools: true
EOF
    LLM_USER_PATH=$WORK/llm timeout 300 "$WORK/llm-venv/bin/llm" -m dflash --no-log \
        -T llm_version "Which version of llm is this?"
}

run_aider() {
    # aider reads context sizes from litellm's table, fetched from the network unless
    # a fresh copy is cached: an empty one, and this model's entry in a metadata file
    mkdir -p "$WORK/home/.aider/caches"
    echo '{}' >"$WORK/home/.aider/caches/model_prices_and_context_window.json"
    cat >"$WORK/aider-models.json" <<EOF
{"openai/local": {"max_input_tokens": 65536, "max_output_tokens": 4096,
  "litellm_provider": "openai", "mode": "chat"}}
EOF
    HOME=$WORK/home timeout 300 "$WORK/aider-venv/bin/aider" \
        --openai-api-base "$URL/v1" --openai-api-key local --model openai/local \
        --model-metadata-file "$WORK/aider-models.json" \
        --message "Say hello." --yes-always --no-git --no-check-update \
        --analytics-disable --no-show-release-notes --no-pretty --no-fancy-input
}

check() {  # client, tool name, tool arguments
    say "== $1"
    local out=$WORK/$1.out
    if ! start_server "$@"; then RESULT[$1]="FAIL (server)"; return; fi
    local status=0
    (cd "$PROJECT" && "run_$1") >"$out" 2>&1 || status=$?
    tail -5 "$out" | sed 's/^/    /'
    local asked
    if ! stop_server; then RESULT[$1]="FAIL (server log)"
    elif [ $status -ne 0 ]; then RESULT[$1]="FAIL (exit $status)"
    elif ! grep -q "It is sunny." "$out"; then RESULT[$1]="FAIL (no answer)"
    else
        asked=$(grep -c '"POST /v1/' "$SERVER_LOG")
        if [ "$2" != none ] && [ "$asked" -lt 2 ]; then  # the call, then its result
            RESULT[$1]="FAIL (no tool round trip)"
        else RESULT[$1]="ok ($asked requests)"; fi
    fi
}

mkdir -p "$PROJECT" "$WORK/home"
echo "hello from a file" >"$PROJECT/hello.txt"
install_clients
for client in $CLIENTS; do
    case $client in
    claude) check claude Read "{\"file_path\": \"$PROJECT/hello.txt\"}" ;;
    codex) check codex exec_command '{"cmd": "cat hello.txt"}' ;;
    llm) check llm llm_version '{}' ;;
    aider) check aider none '{}' ;;  # aider sends no tools: the model just answers
    esac
done
failed=0
echo "client  result"
for client in $CLIENTS; do
    printf '%-7s %s\n' "$client" "${RESULT[$client]}"
    [[ "${RESULT[$client]}" == ok* ]] || failed=1
done
exit $failed
