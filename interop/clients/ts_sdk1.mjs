// `@modelcontextprotocol/sdk` 1.32.2, the 2025-11-25 generation of the TypeScript SDK: an
// interop matrix row (plan and outcome shapes: clients/common.py). Tasks go through its
// experimental tasks client: `callToolStream` with `params.task` (taskCreated, taskStatus,
// result/error), `cancelTask`, and `getTask` + `getTaskResult` to follow a task by id after
// a restart. Input goes through its own mechanism: an `elicitation/create` request handler.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema, ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const STEP_TIMEOUT_MS = 30000;
const TASK = { task: { ttl: 600000 }, timeout: STEP_TIMEOUT_MS };
const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const emit = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
// Logged, not fatal: a rejection inside the library must not end the row unreported.
process.on("unhandledRejection", (reason) => console.error("unhandled rejection:", reason));
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

let answer = null;

async function connect(target) {
  const transport = target.transport === "http"
    ? new StreamableHTTPClientTransport(new URL(target.url))
    : new StdioClientTransport({ command: target.command[0], args: target.command.slice(1), env: target.env, stderr: "ignore" });
  const client = new Client(
    { name: "keel-interop-ts-sdk1", version: "1.0.0" },
    { capabilities: { elicitation: { form: {} }, tasks: { requests: { elicitation: { create: {} } } } } },
  );
  client.setRequestHandler(ElicitRequestSchema, async () =>
    answer && answer.accept ? { action: "accept", content: answer.accept } : { action: "decline" });
  await client.connect(transport);
  return client;
}

const textOf = (result) =>
  (result?.content ?? []).filter((b) => b.type === "text").map((b) => b.text).join("\n");

function errorOf(exc) {
  const code = Number.isInteger(exc?.code) ? exc.code : null;
  return { error: { code, message: String(exc?.message ?? exc).slice(0, 300) } };
}

// Drives one callToolStream to its end: the final result, or the error it ended with.
async function stream(client, tool, args, onCreated, timeout = STEP_TIMEOUT_MS) {
  let created = null;
  const options = { ...TASK, timeout };
  for await (const message of client.experimental.tasks.callToolStream({ name: tool, arguments: args }, CallToolResultSchema, options)) {
    if (message.type === "taskCreated") {
      created = message.task;
      if (onCreated && (await onCreated(message.task))) return { created, stopped: true };
    } else if (message.type === "result") {
      return { created, outcome: { result: { isError: Boolean(message.result.isError), text: textOf(message.result) } } };
    } else if (message.type === "error") {
      return { created, outcome: errorOf(message.error) };
    }
  }
  return { created, outcome: { error: { code: null, message: "stream ended without a result" } } };
}

async function waitStatus(client, taskId, wanted) {
  const deadline = Date.now() + STEP_TIMEOUT_MS;
  while (Date.now() < deadline) {
    const task = await client.experimental.tasks.getTask(taskId);
    if (wanted.includes(task.status)) return task;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`task ${taskId} never reached ${wanted}`);
}

const ops = {
  async call(client, op) {
    answer = op.answer;
    if (op.task === false) {  // a plain tool: an ordinary tools/call, no params.task
      const result = await client.callTool({ name: op.tool, arguments: op.args ?? {} });
      return { result: { isError: Boolean(result.isError), text: textOf(result) } };
    }
    return (await stream(client, op.tool, op.args ?? {})).outcome;
  },
  async cancel(client, op) {
    const { created, outcome } = await stream(client, op.tool, op.args ?? {}, () => true, 5000);
    if (!created) return { error: { code: null, message: `no task created for params.task: ${JSON.stringify(outcome)}`.slice(0, 200) } };
    await client.experimental.tasks.cancelTask(created.taskId);
    const final = await waitStatus(client, created.taskId, ["completed", "failed", "cancelled"]);
    return { status: final.status, text: final.statusMessage ?? "" };
  },
};

async function follow(client, taskId) {
  const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema, { timeout: STEP_TIMEOUT_MS });
  return { result: { isError: Boolean(result.isError), text: textOf(result) } };
}

async function restart(target, op) {
  answer = op.answer;
  const first = await connect(target);
  const running = await stream(first, op.running.tool, op.running.args, () => true, 5000);
  const waiting = await stream(first, op.waiting.tool, op.waiting.args, () => true, 5000);
  if (!running.created || !waiting.created) {
    return { error: { code: null, message: `no task created (params.task ignored?): ${JSON.stringify(running.outcome ?? waiting.outcome)}`.slice(0, 300) } };
  }
  await waitStatus(first, running.created.taskId, ["working"]);
  await waitStatus(first, waiting.created.taskId, ["input_required"]);
  emit({ event: "ready", running: running.created.taskId, waiting: waiting.created.taskId });
  await lines.next();
  await first.close().catch(() => {});
  const second = await connect(target);
  const outcomes = {};
  for (const [name, created] of [["running", running.created], ["waiting", waiting.created]]) {
    try {
      outcomes[name] = await follow(second, created.taskId);
    } catch (exc) {
      outcomes[name] = errorOf(exc);
    }
  }
  await second.close().catch(() => {});
  return outcomes;
}

async function main() {
  for (const leg of plan.legs) await runLeg(leg.target, leg.ops);
  process.exit(0);
}

async function runLeg(target, legOps) {
  const connected = legOps.filter((op) => op.kind !== "restart");
  if (connected.length) {
    let client;
    try {
      client = await connect(target);
    } catch (exc) {
      for (const op of connected) emit({ id: op.id, outcome: errorOf(exc) });
    }
    if (client) {
      for (const op of connected) {
        let outcome;
        try {
          outcome = await ops[op.kind](client, op);
        } catch (exc) {
          outcome = errorOf(exc);
        }
        emit({ id: op.id, outcome });
      }
      await client.close().catch(() => {});
    }
  }
  for (const op of legOps.filter((o) => o.kind === "restart")) {
    let outcome;
    try {
      outcome = await restart(target, op);
    } catch (exc) {
      outcome = errorOf(exc);
    }
    emit({ id: op.id, outcome });
  }
}

main();
