// A rollgate runner: it leases tasks from the gateway's queue, runs an
// unmodified OpenAI Agents SDK agent against the lease's per-rollout base URL
// (so every model call is captured and attributed by the gateway), keeps the
// lease alive with heartbeats, and reports a reward and the outcome.
//
//   node runner.mjs --gateway http://127.0.0.1:8000 --worker runner-1 [--idle-exit-s 5] [--max-tasks N]
//
// Environment: ROLLGATE_ADMIN_TOKEN (when the gateway requires it for /api/v1 writes).
import { Agent, run, tool, OpenAIChatCompletionsModel, setTracingDisabled } from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';

// ---------------------------------------------------------------------------
// The agent: plain Agents SDK code, nothing rollgate-specific. It could be any
// agent; the runner only decides which model endpoint it talks to.
const addTool = tool({
  name: 'add',
  description: 'Add two integers and return the sum.',
  parameters: z.object({ a: z.number().int(), b: z.number().int() }),
  async execute({ a, b }, context) {
    const delay = context?.context?.toolDelayMs ?? 0;
    if (delay > 0) await new Promise((r) => setTimeout(r, delay)); // a slow tool (tests use it)
    return String(a + b);
  },
});

function makeAgent(model, instructions) {
  return new Agent({ name: 'adder', instructions, tools: [addTool], model });
}
// ---------------------------------------------------------------------------

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
    return acc;
  }, []),
);
const gateway = (args.gateway ?? 'http://127.0.0.1:8000').replace(/\/$/, '');
const worker = args.worker ?? `runner-${process.pid}`;
const idleExitS = Number(args['idle-exit-s'] ?? 0); // 0 = poll forever
const maxTasks = Number(args['max-tasks'] ?? 0);
const headers = { 'Content-Type': 'application/json' };
if (process.env.ROLLGATE_ADMIN_TOKEN) headers.Authorization = `Bearer ${process.env.ROLLGATE_ADMIN_TOKEN}`;

setTracingDisabled(true); // traces go to the gateway as captured calls instead

const log = (...m) => console.log(`[${worker}]`, ...m);

async function api(method, path, body) {
  const r = await fetch(`${gateway}/api/v1${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
}

// Resources are immutable per version: fetch each version once.
const resourceCache = new Map();
async function resources(version) {
  if (!version) return {};
  if (!resourceCache.has(version)) {
    const r = await api('GET', `/resources/${version}`);
    if (r.status !== 200) throw new Error(`resources v${version}: ${r.status} ${JSON.stringify(r.body)}`);
    resourceCache.set(version, r.body.resources);
  }
  return resourceCache.get(version);
}

async function runLease(lease) {
  const { rollout_id: rollout, attempt_id: attempt } = lease;
  log(`leased ${rollout} attempt ${attempt} (#${lease.attempt_no}) task ${lease.task_id}`);
  const res = await resources(lease.resources_version);
  let lost = false;
  const everyMs = Math.max(200, (Number(lease.lease_expires_unix_nano) / 1e6 - Date.now()) / 3);
  const beat = setInterval(async () => {
    try {
      const r = await api('POST', `/rollouts/${rollout}/heartbeat`, { attempt_id: attempt, worker_id: worker });
      if (r.status === 409 || r.status === 404) {
        lost = true;
        log(`lease of ${rollout}/${attempt} lost (${r.status}); abandoning it`);
      }
    } catch (e) {
      log(`heartbeat failed: ${e.message}`);
    }
  }, everyMs);
  try {
    const client = new OpenAI({ baseURL: lease.base_url, apiKey: process.env.OPENAI_API_KEY ?? 'rollgate' });
    const modelName = res.llm?.model ?? 'mock-model';
    const agent = makeAgent(new OpenAIChatCompletionsModel(client, modelName), res.instructions ?? 'Use the add tool.');
    const input = lease.input ?? {};
    const result = await run(agent, `What is ${input.a} + ${input.b}?`, {
      context: { toolDelayMs: input.tool_delay_ms ?? 0 },
      maxTurns: 4,
    });
    if (lost) return;
    // The reward: did the agent call the tool with the task's numbers, and say anything?
    const calls = result.newItems.filter((i) => i.type === 'tool_call_item');
    const usedTool = calls.length > 0;
    const answered = typeof result.finalOutput === 'string' && result.finalOutput.length > 0;
    const reward = (usedTool ? 0.5 : 0) + (answered ? 0.5 : 0);
    const rw = await api('POST', `/rollouts/${rollout}/rewards`, { value: reward, attempt_id: attempt });
    if (rw.status !== 200) throw new Error(`reward: ${rw.status} ${JSON.stringify(rw.body)}`);
    const st = await api('POST', `/rollouts/${rollout}/status`, { status: 'succeeded', attempt_id: attempt, worker_id: worker });
    log(`${rollout}/${attempt}: reward ${reward}, status ${st.status === 200 ? 'succeeded' : `refused (${st.status})`}`);
  } catch (e) {
    if (lost) return;
    log(`${rollout}/${attempt} failed: ${e.message}`);
    await api('POST', `/rollouts/${rollout}/status`, { status: 'failed', attempt_id: attempt, worker_id: worker, reason: String(e.message).slice(0, 500) });
  } finally {
    clearInterval(beat);
  }
}

let done = 0;
let idleSince = Date.now();
for (;;) {
  let r;
  try {
    r = await api('POST', '/tasks/dequeue', { worker_id: worker });
  } catch (e) {
    log(`dequeue failed: ${e.message}`);
    await new Promise((res) => setTimeout(res, 500));
    continue;
  }
  if (r.status === 204) {
    if (idleExitS > 0 && Date.now() - idleSince > idleExitS * 1000) break;
    await new Promise((res) => setTimeout(res, 200));
    continue;
  }
  if (r.status !== 200) {
    log(`dequeue: ${r.status} ${JSON.stringify(r.body)}`);
    await new Promise((res) => setTimeout(res, 500));
    continue;
  }
  await runLease(r.body);
  idleSince = Date.now();
  done++;
  if (maxTasks > 0 && done >= maxTasks) break;
}
log(`exiting after ${done} tasks`);
