import json, sys, urllib.request, urllib.error
URL=sys.argv[1]; V="2026-07-28"
def call(method, params, tok, name):
    params=dict(params); params["_meta"]={"io.modelcontextprotocol/protocolVersion":V,"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}
    h={"Content-Type":"application/json","Accept":"application/json, text/event-stream","MCP-Protocol-Version":V,"Mcp-Method":method,"Mcp-Name":name}
    if tok: h["Authorization"]="Bearer "+tok
    req=urllib.request.Request(URL,data=json.dumps({"jsonrpc":"2.0","id":1,"method":method,"params":params}).encode(),headers=h,method="POST")
    try:
        with urllib.request.urlopen(req) as r: return r.status, r.read().decode()
    except urllib.error.HTTPError as e: return e.code, e.read().decode()
s,b=call("tools/call",{"name":"slow_compute","arguments":{"seconds":0.1,"label":"a"}},"tok-alice","slow_compute"); print("alice create",s,b[:200])
tid=json.loads(b)["result"]["taskId"]
print("alice get", call("tasks/get",{"taskId":tid},"tok-alice",tid)[0])
print("bob get", call("tasks/get",{"taskId":tid},"tok-bob",tid))
print("no token", call("tasks/get",{"taskId":tid},None,tid))
