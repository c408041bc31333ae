"""Raw JSON-RPC probes over HTTP (stdlib urllib) to see exact wire bodies + HTTP statuses."""
import json, sys, urllib.request, urllib.error, time
URL = sys.argv[1]
V = "2026-07-28"
def meta(declared=True):
    caps = {"extensions": {"io.modelcontextprotocol/tasks": {}}} if declared else {}
    return {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": caps,
            "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "0"}}
def call(method, params, *, declared=True, name=None, method_hdr=None, accept="application/json, text/event-stream"):
    params = dict(params); params["_meta"] = meta(declared)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    h = {"Content-Type": "application/json", "Accept": accept, "MCP-Protocol-Version": V, "Mcp-Method": method_hdr or method}
    if name is not None: h["Mcp-Name"] = name
    req = urllib.request.Request(URL, data=body, headers=h, method="POST")
    try:
        with urllib.request.urlopen(req) as r: return r.status, r.headers.get("content-type"), r.read().decode()
    except urllib.error.HTTPError as e: return e.code, e.headers.get("content-type"), e.read().decode()
def show(label, res): print(f"--- {label}: HTTP {res[0]} {res[1]}\n    {res[2][:600]}")
show("server/discover", call("server/discover", {}))
r = call("tools/call", {"name": "slow_compute", "arguments": {"seconds": 0.3, "label": "p"}}, name="slow_compute"); show("tools/call declared", r)
tid = json.loads(r[2])["result"]["taskId"]
show("tasks/get immediately", call("tasks/get", {"taskId": tid}, name=tid))
time.sleep(0.6)
show("tasks/get after", call("tasks/get", {"taskId": tid}, name=tid))
show("tasks/get Mcp-Name mismatch", call("tasks/get", {"taskId": tid}, name="other"))
show("tasks/get Mcp-Name missing", call("tasks/get", {"taskId": tid}))
show("tasks/get Mcp-Method mismatch", call("tasks/get", {"taskId": tid}, name=tid, method_hdr="tasks/cancel"))
show("tasks/get unknown id", call("tasks/get", {"taskId": "nope"}, name="nope"))
show("tasks/get undeclared", call("tasks/get", {"taskId": tid}, name=tid, declared=False))
show("tasks/get missing taskId", call("tasks/get", {}, name=""))
show("tasks/update ack", call("tasks/update", {"taskId": tid, "inputResponses": {}}, name=tid))
show("tasks/cancel terminal", call("tasks/cancel", {"taskId": tid}, name=tid))
show("tasks/result", call("tasks/result", {"taskId": tid}, name=tid))
show("tasks/list", call("tasks/list", {}))
show("tools/call legacy params.task", call("tools/call", {"name": "slow_compute", "arguments": {"seconds": 0}, "task": {"ttl": 1000}}, name="slow_compute"))
show("tools/call undeclared", call("tools/call", {"name": "slow_compute", "arguments": {"seconds": 0, "label": "u"}}, name="slow_compute", declared=False))
show("tools/call Mcp-Name mismatch", call("tools/call", {"name": "greet", "arguments": {"name": "a"}}, name="slow_compute"))
show("tools/call need_name (MRTR round 1)", call("tools/call", {"name": "need_name", "arguments": {}}, name="need_name"))
show("tasks/get json-only Accept", call("tasks/get", {"taskId": tid}, name=tid, accept="application/json"))
