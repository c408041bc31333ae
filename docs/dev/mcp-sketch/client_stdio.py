import anyio, sys
from mcp import Client
from mcp.client.stdio import StdioServerParameters
sys.path.insert(0, "/tmp/mcp-sketch")
from client import TasksClientExtension, GetTaskRequest, TaskIdParams, DetailedTask, on_elicit

async def main():
    params = StdioServerParameters(command="/tmp/mcpv2/bin/python", args=["/tmp/mcp-sketch/server.py"])
    async with Client(params, extensions=[TasksClientExtension()], elicitation_callback=on_elicit) as c:
        print("stdio protocol", c.protocol_version, c.server_capabilities.extensions)
        r = await c.call_tool("slow_compute", {"seconds": 0.2, "label": "stdio"})
        print("stdio task ->", r.content[0].text)
        raw = await c.session.call_tool("slow_compute", {"seconds": 0.1, "label": "s"}, allow_claimed=True)
        await anyio.sleep(0.3)
        t = await c.session.send_request(GetTaskRequest(params=TaskIdParams(task_id=raw.task_id)), DetailedTask)
        print("stdio tasks/get ->", t.status, t.result)
    async with Client(params, mode="legacy") as c:
        print("legacy protocol", c.protocol_version, c.server_capabilities.extensions)
        r = await c.call_tool("slow_compute", {"seconds": 0.1, "label": "legacy"})
        print("legacy slow_compute (sync) ->", r.content[0].text)
        try:
            await c.session.send_request(GetTaskRequest(params=TaskIdParams(task_id="x")), DetailedTask)
        except Exception as e:
            print("legacy tasks/get ->", getattr(e, "code", None), e)
anyio.run(main)
