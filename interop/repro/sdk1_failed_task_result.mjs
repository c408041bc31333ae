// Reproduces a defect of `@modelcontextprotocol/sdk` 1.32.2 (2025-11-25 tasks): the
// experimental `callToolStream` reports every `failed` task as `-32603 "Task <id> failed"`
// and never calls `tasks/result`, so the caller loses what the task ended with. In
// 2025-11-25 a tool result with `isError: true` makes the task `failed`, and `tasks/result`
// returns that result (or the JSON-RPC error of a task that failed with one): the server
// has it, the client drops it.
//
//   interop/node_modules/.bin/node interop/repro/sdk1_failed_task_result.mjs   (from the repo root)
//
// Starts `keel serve --app conformance` over stdio (through `uv run`), calls `failing_job`
// (isError) and `protocol_error_job` (a JSON-RPC error) with callToolStream, then asks
// tasks/result for the same tasks. Exit 0: reproduced (the stream said only "Task <id>
// failed" while tasks/result had the tool's own error); 1: not reproduced.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const store = join(mkdtempSync(join(tmpdir(), "keel-repro-")), "repro.db");
const transport = new StdioClientTransport({
  command: "uv",
  args: ["run", "keel", "serve", "--app", "conformance", "--transport", "stdio", "--store", store],
  stderr: "ignore",
});
const client = new Client({ name: "repro", version: "1.0.0" }, { capabilities: {} });
await client.connect(transport);

let reproduced = 0;
for (const [tool, own] of [["failing_job", "simulated tool error"], ["protocol_error_job", "simulated protocol error"]]) {
  let taskId = null;
  let streamed = null;
  const options = { task: { ttl: 60000 }, timeout: 30000 };
  for await (const message of client.experimental.tasks.callToolStream({ name: tool, arguments: {} }, CallToolResultSchema, options)) {
    if (message.type === "taskCreated") taskId = message.task.taskId;
    if (message.type === "error") streamed = message.error.message;
    if (message.type === "result") streamed = JSON.stringify(message.result);
  }
  let fromResult;
  try {
    fromResult = JSON.stringify(await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema));
  } catch (exc) {
    fromResult = `error ${exc.code}: ${exc.message}`;
  }
  console.log(`${tool}: callToolStream -> ${streamed}`);
  console.log(`${tool}: tasks/result   -> ${fromResult}`);
  if (!String(streamed).includes(own) && fromResult.includes(own)) reproduced += 1;
}
await client.close();
console.log(reproduced === 2 ? "reproduced" : "not reproduced");
process.exit(reproduced === 2 ? 0 : 1);
