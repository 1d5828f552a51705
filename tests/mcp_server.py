"""A small MCP server over stdio (newline-delimited JSON-RPC 2.0) for the
test suite: no network, no Node. `mcp_server.py [DIR]` works in DIR (the
tests give the run's workspace) and leaves files there that the tests
look at.

Tools (listed three per page, so a client must follow nextCursor):
  look {text}        read-only (readOnlyHint): "looked: TEXT"
  touch {name}       a side effect: creates the file NAME, answers "touched NAME"
  slow {seconds}     answers after SECONDS; a notifications/cancelled for it
                     leaves "mcp-cancelled.txt" and no answer
  crash {}           writes a line to stderr and exits with status 3
  picture {}         one image (5 bytes of PNG type)
  structured {}      structuredContent only
  fail {}            isError: true
  change {}          adds the tool "extra" and sends tools/list_changed
  has space {}       a name that does not fit the API's tool-name rule
  noise {}           writes bytes that are not UTF-8 and a 200 kB line to stderr
  hangchange {}      sends tools/list_changed, then never answers tools/list
  stringy            a schema that is not of type object
Given a DIR, on start it writes its pid to "mcp-server.pid" and its
environment's names to "mcp-env.txt" there.
"""

import json
import os
import sys
import threading
import time

lock = threading.Lock()
cancelled = set()
extra = False
hang_lists = False


def send(message):
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def tools():
    listed = [
        {"name": "look", "description": "Echo a text.", "annotations": {"readOnlyHint": True},
         "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                         "required": ["text"], "anyOf": [{"required": ["text"]}]}},
        {"name": "touch", "description": "Create a file.",
         "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
        {"name": "slow", "description": "Answer after a while.",
         "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
        {"name": "crash", "description": "Exit.", "inputSchema": {"type": "object"}},
        {"name": "picture", "description": "An image.", "inputSchema": {"type": "object"}},
        {"name": "structured", "description": "Structured content.", "inputSchema": {"type": "object"}},
        {"name": "fail", "description": "A failing tool.", "inputSchema": {"type": "object"}},
        {"name": "change", "description": "Change the tool list.", "inputSchema": {"type": "object"}},
        {"name": "has space", "description": "A bad name.", "inputSchema": {"type": "object"}},
        {"name": "noise", "description": "Stderr noise.", "inputSchema": {"type": "object"}},
        {"name": "hangchange", "description": "Change, then never list.", "inputSchema": {"type": "object"}},
        {"name": "stringy", "description": "A schema of the wrong type.", "inputSchema": {"type": "string"}},
    ]
    if extra:
        listed.append({"name": "extra", "description": "Added later.", "inputSchema": {"type": "object"}})
    return listed


def text_result(text, is_error=False):
    result = {"content": [{"type": "text", "text": text}]}
    if is_error:
        result["isError"] = True
    return result


def call(request_id, name, args):
    global extra
    if name == "look":
        return text_result("looked: " + str(args.get("text", "")))
    if name == "touch":
        target = str(args.get("name", "touched.txt"))
        with open(target, "w") as f:
            f.write("touched")
        return text_result("touched " + target)
    if name == "slow":
        deadline = time.time() + float(args.get("seconds", 1))
        while time.time() < deadline:
            if request_id in cancelled:
                with open("mcp-cancelled.txt", "w") as f:
                    f.write(str(request_id))
                return None
            time.sleep(0.02)
        return text_result("slept")
    if name == "crash":
        sys.stderr.write("about to crash: goodbye\n")
        sys.stderr.flush()
        os._exit(3)
    if name == "picture":
        return {"content": [{"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}]}
    if name == "structured":
        return {"content": [], "structuredContent": {"sum": 3}}
    if name == "fail":
        return text_result("it failed", is_error=True)
    if name == "change":
        extra = True
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        time.sleep(0.1)
        return text_result("changed")
    if name == "extra" and extra:
        return text_result("extra ran")
    if name == "noise":
        # Bytes that are not UTF-8, and a long line without a newline.
        sys.stderr.buffer.write(b"\xff\xfe not utf-8\n" + b"y" * 200000)
        sys.stderr.buffer.write(b"\nnoise done\n")
        sys.stderr.flush()
        return text_result("noisy")
    if name == "hangchange":
        global hang_lists
        hang_lists = True
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        time.sleep(0.1)
        return text_result("changed, and will not list again")
    raise KeyError(name)


def handle_call(request_id, params):
    name = params.get("name")
    try:
        result = call(request_id, name, params.get("arguments") or {})
    except KeyError:
        send({"jsonrpc": "2.0", "id": request_id,
              "error": {"code": -32602, "message": "unknown tool: " + str(name)}})
        return
    if result is not None:
        send({"jsonrpc": "2.0", "id": request_id, "result": result})


running = []


def main():
    # Only with a DIR does it leave its pid and environment names there.
    if len(sys.argv) > 1:
        os.chdir(sys.argv[1])
        with open("mcp-server.pid", "w") as f:
            f.write(str(os.getpid()))
        with open("mcp-env.txt", "w") as f:
            f.write("\n".join(sorted(os.environ.keys())))
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        message = json.loads(line)
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            version = params.get("protocolVersion", "2025-06-18")
            if version > "2025-06-18":
                version = "2025-06-18"
            send({"jsonrpc": "2.0", "id": request_id, "result": {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "subloop-test-server", "version": "1.0"}}})
        elif method == "tools/list" and hang_lists:
            continue
        elif method == "tools/list":
            page = int(str(params.get("cursor") or "page-0").split("-")[1])
            listed = tools()
            result = {"tools": listed[page * 3:page * 3 + 3]}
            if page * 3 + 3 < len(listed):
                result["nextCursor"] = "page-%d" % (page + 1)
            send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif method == "tools/call":
            thread = threading.Thread(target=handle_call, args=(request_id, params), daemon=True)
            thread.start()
            running.append(thread)
        elif method == "notifications/cancelled":
            cancelled.add(params.get("requestId"))
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        elif request_id is not None:
            send({"jsonrpc": "2.0", "id": request_id,
                  "error": {"code": -32601, "message": "method not found: " + str(method)}})
    # stdin closed: calls in flight get a moment to notice a cancellation.
    for thread in running:
        thread.join(0.3)


main()
