import json, sys
sys.argv=[sys.argv[0], sys.argv[1]]
exec(open('/tmp/mcp-sketch/probe.py').read().split('show("server/discover"')[0])
r = call("tools/call", {"name": "slow_compute", "arguments": {"seconds": 0.1, "label": "p"}}, name="slow_compute")
tid = json.loads(r[2])["result"]["taskId"]
show("tasks/update with non-ElicitResult value", call("tasks/update", {"taskId": tid, "inputResponses": {"unknown-key": {"ignored": True}}}, name=tid))
show("tasks/get Mcp-Name with OWS", call("tasks/get", {"taskId": tid}, name="  " + tid + "  "))
show("tasks/get non-ascii id b64", call("tasks/get", {"taskId": "ünï"}, name="=?base64?w7xuw68=?="))
