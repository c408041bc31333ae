// `@modelcontextprotocol/client` 2.4.0 + `@modelcontextprotocol/ext-tasks` 0.2.2: an interop
// matrix row (plan and outcome shapes: clients/common.py). The client negotiates 2026-07-28
// (versionNegotiation auto); ext-tasks drives tasks: `session.callTool` -> `settle()`,
// input through its `onInputRequest` handler (tasks/update), `cancel()`, and
// `resumeTask(serializeReference())` after a restart. ext-tasks needs a `rawDispatch` for
// the V2 task wire shapes the SDK's codecs reject: `RawTap` below sends those requests on
// the client's own transport and hands their responses back before the SDK sees them
// (what the MCP Inspector does with its RawWireChannel).
//
// The `push` op: ext-tasks 0.2.2 does not open `subscriptions/listen` itself. Its session
// takes `notifications/tasks` from the SDK client's notification path (the fallback
// notification handler it installs) and wakes the execution's driver with them; it
// offers `contributeTaskFilterV2` to build the listen filter, which the application
// opens with the SDK's `client.listen()`. That is what the op does, and `RawTap` records
// what really crossed the wire: each `notifications/tasks` received and each request sent
// (TAP_DEBUG=1 in the environment logs every frame to stderr).
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import {
  createApplicationInputHandler,
  createTaskSessionFromClient,
} from "@modelcontextprotocol/ext-tasks/client";
import { contributeTaskFilterV2 } from "@modelcontextprotocol/ext-tasks/core/v2";

const STEP_TIMEOUT_MS = 30000;
const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const emit = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
// Logged, not fatal: a rejection inside the library must not end the row unreported.
process.on("unhandledRejection", (reason) => console.error("unhandled rejection:", reason));
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

class RawTap {
  constructor(inner) {
    this.inner = inner;
    this.pending = new Map();
    this.next = 0;
    this.received = [];  // every notifications/tasks: { taskId, status, subscriptionId }
    this.sent = [];  // every request sent: { id, method, taskId }
    this.acks = [];  // every listen ack: { subscriptionId, taskIds }
  }
  note(message) {
    if (process.env.TAP_DEBUG) console.error("SEND", JSON.stringify(message));
    if (message?.method && "id" in message) this.sent.push({ id: message.id, method: message.method, taskId: message.params?.taskId });
  }
  set onmessage(handler) {
    this.inner.onmessage = (message, extra) => {
      if (process.env.TAP_DEBUG) console.error("RECV", JSON.stringify(message).slice(0, 400));
      if (message?.method === "notifications/subscriptions/acknowledged") {
        this.acks.push({
          subscriptionId: message.params?._meta?.["io.modelcontextprotocol/subscriptionId"] ?? null,
          taskIds: message.params?.notifications?.taskIds ?? [],
        });
      }
      if (message?.method === "notifications/tasks") {
        const params = message.params ?? {};
        this.received.push({
          taskId: params.taskId,
          status: params.status,
          subscriptionId: params._meta?.["io.modelcontextprotocol/subscriptionId"] ?? null,
        });
      }
      const waiter = this.pending.get(message?.id);
      if (waiter && ("result" in message || "error" in message)) {
        this.pending.delete(message.id);
        waiter(message);
        return;
      }
      handler?.(message, extra);
    };
  }
  set onclose(handler) { this.inner.onclose = handler; }
  set onerror(handler) { this.inner.onerror = handler; }
  get sessionId() { return this.inner.sessionId; }
  setProtocolVersion(version) { this.inner.setProtocolVersion?.(version); }
  start() { return this.inner.start(); }
  close() { return this.inner.close(); }
  send(message, options) {
    this.note(message);
    return this.inner.send(message, options);
  }
  dispatch = (request, options) => {
    const id = `raw-${++this.next}`;
    return new Promise((resolve, reject) => {
      const done = (settle, value) => {
        this.pending.delete(id);
        clearTimeout(timer);
        settle(value);
      };
      const timer = setTimeout(() => done(reject, new Error(`no answer to ${request.method}`)), STEP_TIMEOUT_MS);
      this.pending.set(id, (message) => done(resolve, message));
      options?.signal?.addEventListener("abort", () => done(reject, options.signal.reason), { once: true });
      this.note({ ...request, id });
      this.inner.send({ jsonrpc: "2.0", ...request, id }).catch((exc) => done(reject, exc));
    });
  };
}

let answer = null;
const answering = createApplicationInputHandler({
  elicitation: async () =>
    answer && answer.accept ? { action: "accept", content: answer.accept } : { action: "decline" },
  sampling: async () => { throw new Error("no sampling here"); },
  roots: async () => ({ roots: [] }),
});
// ext-tasks drives an execution as soon as it exists (it answers input without being
// asked to settle): before a restart the question must stay open, so nobody answers.
const holding = () => new Promise(() => {});

async function connect(target, onInputRequest = answering, extraCapabilities = {}) {
  const inner = target.transport === "http"
    ? new StreamableHTTPClientTransport(new URL(target.url))
    : new StdioClientTransport({ command: target.command[0], args: target.command.slice(1), env: target.env, stderr: "ignore" });
  const tap = new RawTap(inner);
  const clientInfo = { name: "keel-interop-ts-v2", version: "1.0.0" };
  const capabilities = { elicitation: { form: {} }, ...extraCapabilities };
  const client = new Client(clientInfo, { capabilities, versionNegotiation: { mode: "auto" } });
  await client.connect(tap);
  const session = createTaskSessionFromClient(client, {
    endpointId: "keel-interop",
    onInputRequest,
    rawDispatch: tap.dispatch,
    v2RequestFraming: { protocolVersion: "2026-07-28", clientInfo, clientCapabilities: capabilities },
  });
  return { client, session, tap };
}

function textOf(result) {
  return (result?.content ?? []).filter((b) => b.type === "text").map((b) => b.text).join("\n");
}

function outcomeOf(outcome) {
  if (outcome.status === "completed") {
    return { result: { isError: Boolean(outcome.result?.isError), text: textOf(outcome.result) } };
  }
  if (outcome.status === "failed") {
    const error = outcome.error ?? {};
    return { error: { code: error.code ?? null, message: String(error.message ?? error) } };
  }
  return { status: outcome.status, text: "" };
}

function errorOf(exc) {
  const code = Number.isInteger(exc?.code) ? exc.code : null;
  return { error: { code, message: String(exc?.message ?? exc).slice(0, 300) } };
}

const withTimeout = (promise) =>
  Promise.race([promise, new Promise((_, reject) => setTimeout(() => reject(new Error("timed out")), STEP_TIMEOUT_MS))]);

async function waitStatus(session, taskId, wanted, message) {
  const deadline = Date.now() + STEP_TIMEOUT_MS;
  while (Date.now() < deadline) {
    const view = await session.task(taskId).snapshot();
    if (wanted.includes(view.status) && (message === undefined || view.statusMessage === message)) return view;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`task ${taskId} never reached ${wanted}`);
}

const ops = {
  async call({ session }, op) {
    answer = op.answer;
    const execution = await session.callTool(op.tool, op.args ?? {});
    const { outcome } = await withTimeout(execution.settle());
    return outcomeOf(outcome);
  },
  async cancel({ session }, op) {
    const execution = await session.callTool(op.tool, op.args ?? {});
    if (execution.kind !== "task") return { na: "the server answered inline" };
    await waitStatus(session, execution.handle.taskId, ["working"]);
    await execution.cancel();
    const { outcome } = await withTimeout(execution.settle());
    return { status: outcome.status, text: "" };
  },
};

// Its own connection, declaring the tasks extension on the SDK client too: the listen
// request is the SDK's, and a listen naming task ids needs the extension declared on it.
const TASKS_EXTENSION = { extensions: { "io.modelcontextprotocol/tasks": {} } };

async function push(target, op) {
  const { client, session, tap } = await connect(target, answering, TASKS_EXTENSION);
  try {
    return await follow(client, session, tap, op);
  } finally {
    await session.close().catch(() => {});
    await client.close().catch(() => {});
  }
}

// Start the task, listen to it, settle it; report what crossed the wire meanwhile.
async function follow(client, session, tap, op) {
  const before = tap.sent.length;
  const execution = await session.callTool(op.tool, op.args ?? {});
  if (execution.kind !== "task") return { na: "the server answered inline" };
  const taskId = execution.handle.taskId;
  const received = tap.received.length;
  const acks = tap.acks.length;
  const filter = contributeTaskFilterV2({}, [taskId]).notifications;
  const subscription = await withTimeout(client.listen(filter));
  let settled;
  try {
    settled = outcomeOf((await withTimeout(execution.settle())).outcome);
  } catch (exc) {
    settled = errorOf(exc);
  }
  // Keel ends a listen gracefully once every task it names has ended.
  const closed = await Promise.race([subscription.closed, new Promise((r) => setTimeout(() => r("open"), 2000))]);
  await subscription.close().catch(() => {});
  const mine = (entry) => entry.taskId === taskId;
  const sent = tap.sent.slice(before);
  return {
    push: {
      taskId,
      ack: tap.acks.slice(acks)[0] ?? null,  // as it came on the wire
      sdkHonored: subscription.honoredFilter,  // as the SDK's McpSubscription reports it
      received: tap.received.slice(received).filter(mine),
      listenId: sent.find((s) => s.method === "subscriptions/listen")?.id ?? null,
      polls: sent.filter((s) => mine(s) && s.method === "tasks/get").length,
      closed,
      ...settled,
    },
  };
}

async function restart(target, op) {
  answer = op.answer;
  const first = await connect(target, holding);
  const running = await first.session.callTool(op.running.tool, op.running.args);
  const waiting = await first.session.callTool(op.waiting.tool, op.waiting.args);
  const references = { running: running.serializeReference(), waiting: waiting.serializeReference() };
  await waitStatus(first.session, running.handle.taskId, ["working"], op.running.message ?? undefined);
  await waitStatus(first.session, waiting.handle.taskId, ["input_required"]);
  emit({ event: "ready", running: running.handle.taskId, waiting: waiting.handle.taskId });
  await lines.next();  // the server was killed under the open connection meanwhile
  await first.session.close().catch(() => {});
  await first.client.close().catch(() => {});
  const second = await connect(target);
  const outcomes = {};
  for (const name of ["running", "waiting"]) {
    try {
      const execution = await second.session.resumeTask(references[name]);
      outcomes[name] = outcomeOf((await withTimeout(execution.settle())).outcome);
    } catch (exc) {
      outcomes[name] = errorOf(exc);
    }
  }
  await second.session.close().catch(() => {});
  await second.client.close().catch(() => {});
  return outcomes;
}

const own = { push, restart };  // ops with a connection of their own

async function main() {
  for (const leg of plan.legs) await runLeg(leg.target, leg.ops);
  process.exit(0);
}

async function runLeg(target, legOps) {
  const connected = legOps.filter((op) => !(op.kind in own));
  if (connected.length) {
    let conn;
    try {
      conn = await connect(target);
    } catch (exc) {
      for (const op of connected) emit({ id: op.id, outcome: errorOf(exc) });
    }
    if (conn) {
      for (const op of connected) {
        let outcome;
        try {
          outcome = await ops[op.kind](conn, op);
        } catch (exc) {
          outcome = errorOf(exc);
        }
        emit({ id: op.id, outcome });
      }
      await conn.session.close().catch(() => {});
      await conn.client.close().catch(() => {});
    }
  }
  for (const op of legOps.filter((o) => o.kind in own)) {
    let outcome;
    try {
      outcome = await own[op.kind](target, op);
    } catch (exc) {
      outcome = errorOf(exc);
    }
    emit({ id: op.id, outcome });
  }
}

main();
