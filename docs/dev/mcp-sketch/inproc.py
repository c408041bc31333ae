import anyio, sys
sys.path.insert(0, "/tmp/mcp-sketch")
import server as srv
from client import TasksClientExtension, on_elicit
from mcp import Client
async def main():
    async with Client(srv.mcp, extensions=[TasksClientExtension()], elicitation_callback=on_elicit) as c:
        print("inproc", c.protocol_version, (await c.call_tool("slow_compute", {"seconds": 0.1, "label": "ip"})).content[0].text)
anyio.run(main)
