import json, sys, time, http.client, statistics
host, port = "127.0.0.1", int(sys.argv[1]); V="2026-07-28"
conn = http.client.HTTPConnection(host, port)
meta={"io.modelcontextprotocol/protocolVersion":V,"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}
def rpc(method, params, name):
    params=dict(params, _meta=meta)
    conn.request("POST","/mcp",json.dumps({"jsonrpc":"2.0","id":1,"method":method,"params":params}),
      {"Content-Type":"application/json","Accept":"application/json, text/event-stream","MCP-Protocol-Version":V,"Mcp-Method":method,"Mcp-Name":name})
    r=conn.getresponse(); return json.loads(r.read())
lat={"create":[],"get":[],"greet":[]}
for i in range(300):
    t=time.perf_counter(); r=rpc("tools/call",{"name":"slow_compute","arguments":{"seconds":0,"label":"b"}},"slow_compute"); lat["create"].append(time.perf_counter()-t)
    tid=r["result"]["taskId"]
    t=time.perf_counter(); rpc("tasks/get",{"taskId":tid},tid); lat["get"].append(time.perf_counter()-t)
    t=time.perf_counter(); rpc("tools/call",{"name":"greet","arguments":{"name":"x"}},"greet"); lat["greet"].append(time.perf_counter()-t)
for k,v in lat.items():
    v=sorted(v); print(k, "p50 %.2f ms p99 %.2f ms"%(v[len(v)//2]*1e3, v[int(len(v)*.99)]*1e3))
