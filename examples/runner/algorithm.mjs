// The algorithm's side of one training step against rollgate: publish the
// resources, enqueue a dataset (each task --group times, the GRPO group),
// wait for the rollouts through the completion cursor, then run the trainer
// bridge on exactly the rollouts that completed in this step.
//
//   node algorithm.mjs --gateway http://127.0.0.1:8000 --dataset dataset.jsonl --group 4 \
//       --after 0 --bridge "rollgate bridge --db ./rollgate.db --estimator grpo" --out batch.jsonl
//
// It prints the next cursor last ("cursor N"), to pass as --after next step.
// Environment: ROLLGATE_ADMIN_TOKEN (when the gateway requires it for /api/v1 writes).
import { readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
    return acc;
  }, []),
);
const gateway = (args.gateway ?? 'http://127.0.0.1:8000').replace(/\/$/, '');
const group = Number(args.group ?? 2);
const timeoutS = Number(args['timeout-s'] ?? 300);
const after = Number(args.after ?? 0);
const headers = { 'Content-Type': 'application/json' };
if (process.env.ROLLGATE_ADMIN_TOKEN) headers.Authorization = `Bearer ${process.env.ROLLGATE_ADMIN_TOKEN}`;

async function api(method, path, body) {
  const r = await fetch(`${gateway}/api/v1${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  const out = { status: r.status, body: text ? JSON.parse(text) : null };
  if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${text}`);
  return out;
}

// 1. Resources for this step (the runner reads the version its lease names).
const res = await api('POST', '/resources', {
  resources: {
    llm: { model: args.model ?? 'mock-model' },
    instructions: 'Use the add tool to add the two numbers, then state the sum.',
  },
});
console.log(`published resources v${res.body.version}`);

// 2. The dataset: one JSON object per line, {"task_id": ..., "input": {...}}.
const dataset = args.dataset
  ? readFileSync(args.dataset, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l))
  : [
      { task_id: 'add-2-3', input: { a: 2, b: 3 } },
      { task_id: 'add-5-8', input: { a: 5, b: 8 } },
    ];
const tasks = [];
for (const t of dataset) {
  for (let g = 0; g < group; g++) {
    tasks.push({ max_attempts: Number(args['max-attempts'] ?? 3), lease_s: Number(args['lease-s'] ?? 30), ...t });
  }
}
const { body: enq } = await api('POST', '/tasks', tasks);
const pending = new Set(enq.rollout_ids);
console.log(`enqueued ${pending.size} rollouts (${dataset.length} tasks x ${group})`);

// 3. Wait for them in completion order.
let cursor = after;
const deadline = Date.now() + timeoutS * 1000;
const outcome = {};
while (pending.size > 0) {
  if (Date.now() > deadline) throw new Error(`${pending.size} rollouts still open after ${timeoutS}s`);
  const { body } = await api('GET', `/rollouts?after=${cursor}&limit=500&wait_s=10`);
  for (const r of body.rollouts) {
    if (pending.delete(r.rollout_id)) {
      outcome[r.status] = (outcome[r.status] ?? 0) + 1;
      const reward = r.rewards?.find((x) => x.sequence_id === 0)?.value;
      console.log(`completed ${r.rollout_id} ${r.status} after ${r.attempt_no} attempt(s), ${r.calls?.calls ?? 0} calls, reward ${reward}`);
    }
  }
  cursor = body.next_after;
}
console.log(`all rollouts done: ${JSON.stringify(outcome)}`);

// 4. The batch for the trainer: exactly the rollouts completed after --after.
if (args.bridge) {
  const [cmd, ...rest] = args.bridge.split(/\s+/).filter(Boolean);
  const bridgeArgs = [...rest, '--after', String(after), '--out', args.out ?? 'batch.jsonl'];
  console.log(`running: ${cmd} ${bridgeArgs.join(' ')}`);
  const b = spawnSync(cmd, bridgeArgs, { stdio: 'inherit' });
  if (b.status !== 0) throw new Error(`bridge exited with ${b.status}`);
}
console.log(`cursor ${cursor}`);
