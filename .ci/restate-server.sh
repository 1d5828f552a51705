#!/usr/bin/env bash
# A real Restate server for the durable-run tests: the pinned npm package
# `@restatedev/restate-server` (its `-linux-x64` binary), cached outside the
# repository, started on loopback ports with a temporary base directory.
#
#   .ci/restate-server.sh setup DIR                   install into DIR (idempotent)
#   .ci/restate-server.sh start DIR BASE INGRESS ADMIN NODE
#                                                     start with everything in BASE, wait
#                                                     until ready; prints the pid
set -euo pipefail

RESTATE_VERSION=1.7.12

binary() {
    echo "$1/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
}

setup() {
    local dir="$1"
    mkdir -p "$dir"
    if [ "$("$(binary "$dir")" --version 2>/dev/null)" != "restate-server $RESTATE_VERSION" ]; then
        echo "[restate] installing @restatedev/restate-server $RESTATE_VERSION" >&2
        command -v npm >/dev/null || { echo "[restate] npm is needed" >&2; exit 1; }
        npm install --no-save --no-audit --no-fund --ignore-scripts --prefix "$dir" \
            "@restatedev/restate-server@$RESTATE_VERSION" >/dev/null
        "$(binary "$dir")" --version >/dev/null
    fi
}

start() {
    local dir="$1" base="$2" ingress="$3" admin="$4" node="$5"
    mkdir -p "$base/tmp" "$base/data"
    # Its state in BASE/data, its own temporary files (the invoker's spill
    # files) in BASE/tmp: nothing of it outside BASE.
    TMPDIR="$base/tmp" \
    RESTATE_INGRESS__BIND_ADDRESS="127.0.0.1:$ingress" \
    RESTATE_ADMIN__BIND_ADDRESS="127.0.0.1:$admin" \
    RESTATE_DISABLE_TELEMETRY=true \
        "$(binary "$dir")" --no-logo --bind-ip 127.0.0.1 --bind-port "$node" \
        --base-dir "$base/data" --listen-mode tcp >"$base/server.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 300); do
        if curl -fsS "http://127.0.0.1:$admin/health" >/dev/null 2>&1 \
            && curl -fsS "http://127.0.0.1:$ingress/restate/health" >/dev/null 2>&1; then
            echo "$pid"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "[restate] the server exited; its log:" >&2
            cat "$base/server.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "[restate] the server did not become ready in 30 s" >&2
    kill "$pid" 2>/dev/null || true
    exit 1
}

case "${1:-}" in
    setup) setup "$2" ;;
    start) start "$2" "$3" "$4" "$5" "$6" ;;
    *) echo "usage: $0 setup DIR | start DIR BASE INGRESS ADMIN NODE" >&2; exit 2 ;;
esac
