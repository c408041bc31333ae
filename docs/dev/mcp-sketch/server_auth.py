"""Same extension, with bearer auth: a TokenVerifier maps 'tok-<name>' to a principal."""
import sys
sys.path.insert(0, "/tmp/mcp-sketch")
from mcp.server import MCPServer
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
import server as base

class Verifier:
    async def verify_token(self, token: str):
        if token.startswith("tok-"):
            return AccessToken(token=token, client_id="cli", scopes=[], subject=token[4:], claims={"iss": "http://127.0.0.1"})
        return None

ext = base.TasksExtension()
async def _noop(): pass
from contextlib import asynccontextmanager
import anyio
@asynccontextmanager
async def lifespan(_):
    async with anyio.create_task_group() as tg:
        ext.tg = tg
        yield {}
        tg.cancel_scope.cancel()

mcp = MCPServer("tasks-auth", extensions=[ext], lifespan=lifespan, token_verifier=Verifier(),
                auth=AuthSettings(issuer_url="http://127.0.0.1:9", resource_server_url=None))
mcp.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]), json_response=True)
