#!/usr/bin/env bash
# Real agent clients against `dflash-mlx serve`, in one command (about 10 minutes, most
# of it installing). The clients come from npm and PyPI, into a temporary folder. For
# each client a server starts on 127.0.0.1 with a tiny scripted target
# (examples/clients_target.py, 64K context) that calls one of the client's own tools;
# the client runs it and sends the result back, and the model answers. One
# non-interactive prompt per client. It passes when every client exits 0 and no server
# log line shows a 4xx/5xx or a traceback. Claude Code, Codex, llm and aider are set up
# by hand as docs/server.md's recipes say; the others by `dflash-mlx launch CLIENT
# --port PORT` (the same settings `launch` gives them), reusing the server. Nothing but
# the package registries is contacted; each client's telemetry, update checks and
# network extras are off.
#
#   examples/clients_check.sh                     # every client below
#   CLIENTS="claude codex" examples/clients_check.sh
#   KEEP=1 examples/clients_check.sh              # keep the temporary folder (logs)
#   INSTALLED=/tmp/clients examples/clients_check.sh   # install there once, reuse
#
# Clients: claude codex llm aider opencode kilo qwen continue cline mini interpreter.
# Versions: the newest of each ("latest"), printed as they run; VERSION variables pin
# one, e.g. CLAUDE_CODE_VERSION=2.1.197. Kilo's newest release (7.8.1) has no Linux
# binary on npm yet, so KILO_VERSION defaults to 7.7.7. Crush is not here: its npm
# package downloads its binary from GitHub, which this machine cannot reach.
# CLIENT_PYTHON picks the Python for the clients' virtual environments (aider and Open
# Interpreter need 3.10-3.12).

set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${DFLASH_PYTHON:-$ROOT/.venv/bin/python}
DFLASH=$(dirname "$PY")/dflash-mlx
CLIENT_PYTHON=${CLIENT_PYTHON:-python3}
CLIENTS=${CLIENTS:-claude codex llm aider opencode kilo qwen continue cline mini interpreter}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-clients.XXXXXX")
BIN=${INSTALLED:-$WORK}
PROJECT=$WORK/project
SERVER_PID=""
declare -A RESULT

cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
    pkill -f "$WORK/" 2>/dev/null  # what a client left running (Cline's hub daemon)
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
say() { printf '%s  %s\n' "$(date +%T)" "$*"; }

install_clients() {
    local npm_pkgs=() want
    for want in $CLIENTS; do
        case $want in
        claude) npm_pkgs+=("@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION:-latest}") ;;
        codex) npm_pkgs+=("@openai/codex@${CODEX_VERSION:-latest}") ;;
        opencode) npm_pkgs+=("opencode-ai@${OPENCODE_VERSION:-latest}") ;;
        kilo) npm_pkgs+=("@kilocode/cli@${KILO_VERSION:-7.7.7}") ;;
        qwen) npm_pkgs+=("@qwen-code/qwen-code@${QWEN_CODE_VERSION:-latest}") ;;
        continue) npm_pkgs+=("@continuedev/cli@${CONTINUE_VERSION:-latest}") ;;
        cline) npm_pkgs+=("cline@${CLINE_VERSION:-latest}") ;;
        llm) venv llm "llm==${LLM_VERSION:-latest}" ;;
        aider) venv aider "aider-chat==${AIDER_VERSION:-latest}" ;;
        mini) venv mini "mini-swe-agent==${MINI_VERSION:-latest}" ;;
        interpreter) venv interpreter "open-interpreter==${INTERPRETER_VERSION:-latest}" ;;
        *) say "unknown client '$want'"; exit 2 ;;
        esac
    done
    if [ ${#npm_pkgs[@]} -gt 0 ] && [ ! -e "$BIN/npm/.done" ]; then
        say "npm install ${npm_pkgs[*]}"
        timeout 600 npm install --prefix "$BIN/npm" --no-audit --no-fund \
            --loglevel=error "${npm_pkgs[@]}" >"$WORK/npm.log" 2>&1 ||
            { tail -20 "$WORK/npm.log"; exit 1; }
        touch "$BIN/npm/.done"
    fi
    PATH=$BIN/npm/node_modules/.bin:$PATH
    for want in llm aider mini interpreter; do  # on PATH for `launch`
        [ -d "$BIN/$want-venv" ] && PATH=$PATH:$BIN/$want-venv/bin
    done
}

venv() {  # name, requirement: a virtual environment of its own (no resolver fights)
    local spec=${2/==latest/}
    [ -e "$BIN/$1-venv/.done" ] && return
    say "pip install $spec"
    timeout 600 "$CLIENT_PYTHON" -m venv "$BIN/$1-venv" &&
        timeout 600 "$BIN/$1-venv/bin/pip" install -q --disable-pip-version-check \
            "$spec" >"$WORK/$1-pip.log" 2>&1 ||
        { tail -20 "$WORK/$1-pip.log"; exit 1; }
    touch "$BIN/$1-venv/.done"
}

start_server() {  # client, the tool call its model makes: name, JSON arguments
    local models=$WORK/models/$1  # THEN_CALL: the same tool's arguments once a result is back
    SERVER_LOG=$WORK/server-$1.log
    "$PY" "$ROOT/examples/clients_target.py" "$models" --call "$2" "$3" \
        ${THEN_CALL:+--then "$2" "$THEN_CALL"} >/dev/null || return 1
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
        timeout 300 "$BIN/npm/node_modules/.bin/claude" -p "What does hello.txt say?"
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
        timeout 300 "$BIN/npm/node_modules/.bin/codex" exec --skip-git-repo-check \
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
    LLM_USER_PATH=$WORK/llm timeout 300 "$BIN/llm-venv/bin/llm" -m dflash --no-log \
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
    HOME=$WORK/home timeout 300 "$BIN/aider-venv/bin/aider" \
        --openai-api-base "$URL/v1" --openai-api-key local --model openai/local \
        --model-metadata-file "$WORK/aider-models.json" \
        --message "Say hello." --yes-always --no-git --no-check-update \
        --analytics-disable --no-show-release-notes --no-pretty --no-fancy-input
}

launch() {  # client, its arguments: `dflash-mlx launch` on the running server
    HOME=$WORK/home timeout 300 "$DFLASH" launch "$1" --port "${URL##*:}" -- "${@:2}" \
        </dev/null
}

run_opencode() {
    OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_AUTOUPDATE=1 \
        OPENCODE_DISABLE_LSP_DOWNLOAD=1 launch opencode run "What does hello.txt say?"
}

run_kilo() {
    KILO_DISABLE_MODELS_FETCH=1 KILO_DISABLE_AUTOUPDATE=1 KILO_DISABLE_LSP_DOWNLOAD=1 \
        KILO_DISABLE_SHARE=1 launch kilo run "What does hello.txt say?"
}

run_qwen() { launch qwen -p "What does hello.txt say?"; }

run_continue() { launch continue -p "What does hello.txt say?"; }

run_mini() {  # it reads the file, then its second call submits the task
    launch mini -t "What does hello.txt say?" -y --exit-immediately
}

run_interpreter() {  # reads the prompt from stdin; the end of stdin ends it
    echo "What does hello.txt say?" | HOME=$WORK/home timeout 300 "$DFLASH" launch \
        interpreter --port "${URL##*:}" -- -y
}

run_cline() { launch cline "What does hello.txt say?"; }  # `cline auth` first

check() {  # client, tool name, tool arguments[, the answer expected[, requests]]
    say "== $1 $(version "$1")"
    local out=$WORK/$1.out expect=${4:-It is sunny.} least=${5:-2}
    if ! start_server "$1" "$2" "$3"; then RESULT[$1]="FAIL (server)"; return; fi
    local status=0
    (cd "$PROJECT" && "run_$1") >"$out" 2>&1 || status=$?
    tail -5 "$out" | sed 's/^/    /'
    local asked
    if ! stop_server; then RESULT[$1]="FAIL (server log)"
    elif [ $status -ne 0 ]; then RESULT[$1]="FAIL (exit $status)"
    elif ! grep -q "$expect" "$out"; then RESULT[$1]="FAIL (no answer)"
    else
        asked=$(grep -c '"POST /v1/' "$SERVER_LOG")
        if [ "$2" != none ] && [ "$asked" -lt "$least" ]; then  # the call, its result
            RESULT[$1]="FAIL (no tool round trip)"
        else RESULT[$1]="ok ($asked requests)"; fi
    fi
}

version() {  # the client's version, as it prints it
    local exe=$1
    case $1 in continue) exe=cn ;; esac
    [ "$1" = mini ] && { "$BIN/mini-venv/bin/pip" show mini-swe-agent | grep Version; return; }
    [ "$1" = interpreter ] && {
        "$BIN/interpreter-venv/bin/pip" show open-interpreter | grep Version; return; }
    HOME=$WORK/home timeout 30 "$exe" --version 2>/dev/null | tail -1
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
    opencode | kilo) check "$client" read "{\"filePath\": \"$PROJECT/hello.txt\"}" ;;
    qwen) check qwen read_file "{\"file_path\": \"$PROJECT/hello.txt\"}" ;;
    continue) check continue Read "{\"filepath\": \"$PROJECT/hello.txt\"}" ;;
    cline) check cline read_files "{\"files\": [{\"path\": \"$PROJECT/hello.txt\"}]}" ;;
    mini) THEN_CALL='{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat hello.txt"}' \
        check mini bash '{"command": "cat hello.txt"}' "hello from a file" ;;
    interpreter) check interpreter execute \
        '{"language": "shell", "code": "cat hello.txt"}' ;;
    esac
done
failed=0
echo "client       result"
for client in $CLIENTS; do
    printf '%-12s %s\n' "$client" "${RESULT[$client]}"
    [[ "${RESULT[$client]}" == ok* ]] || failed=1
done
exit $failed
