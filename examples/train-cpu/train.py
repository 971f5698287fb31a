"""The loop, closed on a CPU: a policy that learns through rollgate.

Agents written with the OpenAI Python SDK run a two-turn task with one tool
call per episode against a real vLLM (SmolLM2-135M-Instruct) through `rollgate
serve`; rewards and statuses go to rollgate's task API; each step's rollouts
become a safetensors batch (`rollgate bridge`), loaded as verl's DataProto;
verl computes the GRPO advantages and the clipped policy loss; torch updates a
LoRA adapter on CPU; the adapter reaches vLLM in place
(POST /v1/load_lora_adapter with load_inplace) between rollgate's pause and
resume, and rollgate's routing table gets the new policy_version, which every
captured call records.

The task ("secret"): the agent must call the tool get_secret (forced through
tool_choice, so every episode has a tool call; vLLM produces it with its
structured output), receives a two-digit number as the tool's result, and must
answer with that number first (1), or at least hold it (0.5), or at least
start with a digit (0.25; a stepping stone that makes the signal denser). The agent asks for the call up to three
times when the answer holds no well-formed call; an episode without one fails
(reward 0). The base model copies the
number some of the time and wanders off some of the time (it is in context,
one token or two away): a skill it has weakly, which a policy gradient can
sharpen in a few steps of a few dozen episodes.

Run by examples/train-cpu/run (which starts vLLM and rollgate serve);
python train.py --help for the options.
"""

import argparse
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import time
import urllib.request

import numpy as np
import torch

import rollgate

SYSTEM = "You are a helpful assistant. Call the tool get_secret to learn the secret number, then reply with the number."
USER = "What is the secret number?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_secret",
            "description": "Returns the secret number.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def reward_for(answer, secret):
    a = answer.strip()
    if a.startswith(secret):
        return 1.0
    if secret in a:
        return 0.5
    if a[:1].isdigit():
        return 0.25  # a number first, not the secret: the way there
    return 0.0


def http_json(method, url, body=None, token=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
        if r.headers.get_content_type() != "application/json":
            return raw.decode(errors="replace")  # vLLM's load_lora_adapter answers plain text
        return json.loads(raw) if raw else None


def episode(lease, policy_model, seed):
    """One rollout: a forced tool call, the tool's result, the answer."""
    from openai import OpenAI

    client = OpenAI(base_url=lease["base_url"], api_key="unused", timeout=600, max_retries=0)
    secret = str(lease["input"]["secret"])
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    # tool_choice "required": vLLM 0.32 constrains the answer to the hermes
    # form <tool_call>{"name": ..., "arguments": ...}</tool_call> with a known
    # name (its arguments are not held to the declared schema on this engine).
    # An answer cut before the closing tag parses as no tool call; the agent
    # asks again, up to three times, as tool-using harnesses do. Every try is
    # a captured call and a training sample.
    calls, tries = [], 0
    while not calls and tries < 3:
        tries += 1
        first = client.chat.completions.create(
            model=policy_model,
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=96,
            temperature=1.0,
            seed=seed + 100 * tries,
            extra_headers={"x-agent-name": "tool-caller"},
        )
        calls = first.choices[0].message.tool_calls or []
    if not calls:
        # The policy never produced a well-formed call: the episode fails
        # (reward 0), and its tries are trained on with that reward.
        return {"rollout_id": lease["rollout_id"], "attempt_id": lease["attempt_id"], "answer": "",
                "reward": 0.0, "tool_calls": 0, "calls": tries}
    call = calls[0]
    messages.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call.id, "content": secret})
    second = client.chat.completions.create(
        model=policy_model, messages=messages, max_tokens=12, temperature=1.0, seed=seed + 1,
        extra_headers={"x-agent-name": "answerer"},
    )
    answer = second.choices[0].message.content or ""
    return {"rollout_id": lease["rollout_id"], "attempt_id": lease["attempt_id"], "answer": answer,
            "reward": reward_for(answer, secret), "tool_calls": len(calls), "calls": tries + 1}


def wait_captured(gw, rollout_ids, calls_each, timeout=120):
    """Waits until the store holds every call of these rollouts (capture is
    asynchronous: the bridge must not read a step before its rows are in)."""
    deadline = time.monotonic() + timeout
    pending = set(rollout_ids)
    while pending:
        for r in list(pending):
            if len(gw.rollout(r).get("calls") or []) >= calls_each:
                pending.discard(r)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"calls of {sorted(pending)[:3]} not stored after {timeout}s")
        time.sleep(0.1)  # polling the rollout read: the store cannot tell us


MICRO_BATCH = 4  # rows per forward pass: logits are [rows, R+1, 49,152] floats


def response_logprobs(model, b, rows):
    """log p(response token | prefix) of the given rows, from the batch's ids:
    [len(rows), R]. Only the last R+1 positions' logits are computed
    (logits_to_keep), so memory is rows x (R+1) x vocabulary."""
    R = b["responses"].shape[1]
    out = model(input_ids=b["input_ids"][rows], attention_mask=b["attention_mask"][rows],
                position_ids=b["position_ids"][rows], logits_to_keep=R + 1)
    logits = out.logits[:, :-1, :].float()
    return -torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), b["responses"][rows].reshape(-1), reduction="none"
    ).view(len(rows), R)


def micro_batches(n):
    return [list(range(i, min(i + MICRO_BATCH, n))) for i in range(0, n, MICRO_BATCH)]


def probe(args):
    """The engine's logprobs of a fixed greedy answer under the policy: they
    change when new weights reach vLLM, so each update is checked, not
    assumed."""
    out = http_json("POST", args.vllm + "/chat/completions", {
        "model": args.policy_model, "messages": [{"role": "user", "content": "Say a number."}],
        "max_tokens": 4, "temperature": 0, "logprobs": True})
    return [t["logprob"] for t in out["choices"][0]["logprobs"]["content"]]


def set_policy(args, gw_url, adapter_dir, version):
    """The weight update: pause rollgate (new calls are held), load the adapter
    into vLLM in place, record the new policy_version in rollgate's routing
    table, resume."""
    t0 = time.monotonic()
    http_json("POST", gw_url + "/api/v1/pause", {}, args.admin_token)
    try:
        http_json("POST", args.vllm + "/load_lora_adapter",
                  {"lora_name": args.policy_model, "lora_path": adapter_dir, "load_inplace": True}, timeout=600)
        # Direct to vLLM, not through rollgate: rollgate holds calls while paused.
        table = http_json("GET", gw_url + "/api/v1/backends", token=args.admin_token)
        pools = []
        for p in table["backends"]:
            reps = [{"url": r["url"], "kind": r.get("kind") or "vllm", "policy_version": str(version),
                     **({"weight": r["weight"]} if r.get("weight") else {})} for r in p["replicas"]]
            pools.append({"model": p["model"], "replicas": reps})
        http_json("PUT", gw_url + "/api/v1/backends", {"backends": pools}, args.admin_token)
    finally:
        http_json("POST", gw_url + "/api/v1/resume", {}, args.admin_token)
    return time.monotonic() - t0


def plot(rows, path):
    """Mean reward per step (with its spread) as a PNG, drawn with Pillow."""
    from PIL import Image, ImageDraw

    W, H, L, B, T, Rm = 720, 400, 60, 50, 30, 20
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    n = len(rows)
    x = lambda i: L + (W - L - Rm) * (i / max(n - 1, 1))
    y = lambda v: T + (H - T - B) * (1 - v)
    d.line([(L, T), (L, H - B), (W - Rm, H - B)], fill="black")
    for v in (0, 0.25, 0.5, 0.75, 1.0):
        d.line([(L - 4, y(v)), (W - Rm, y(v))], fill=(225, 225, 225))
        d.text((L - 40, y(v) - 6), f"{v:.2f}", fill="black")
    for i, r in enumerate(rows):
        lo, hi = max(0, r["reward_mean"] - r["reward_std"]), min(1, r["reward_mean"] + r["reward_std"])
        d.line([(x(i), y(lo)), (x(i), y(hi))], fill=(150, 180, 230), width=3)
        d.text((x(i) - 4, H - B + 8), str(r["step"]), fill="black")
    pts = [(x(i), y(r["reward_mean"])) for i, r in enumerate(rows)]
    if len(pts) > 1:
        d.line(pts, fill=(20, 80, 200), width=2)
    for p in pts:
        d.ellipse([p[0] - 3, p[1] - 3, p[0] + 3, p[1] + 3], fill=(20, 80, 200))
    d.text((L, 8), "mean reward per step (bars: one standard deviation), SmolLM2-135M through rollgate", fill="black")
    d.text((W // 2 - 20, H - 20), "step", fill="black")
    img.save(path)


def report(rows, out):
    """reward.png and the markdown table of the steps."""
    plot(rows, os.path.join(out, "reward.png"))
    print("\n| step | policy version | mean reward | std | answers starting with the number | episodes with a tool call | answer turns: mean abs logprob diff (trainer - engine) | p99 | max | tool-call turns: mean | step s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['step']} | {r['policy_version']} | {r['reward_mean']:.3f} | {r['reward_std']:.3f} | "
              f"{r['starts_with_number']:.2f} | {r['episodes_with_tool_call']}/{r['episodes']} | {r['logprob_diff_mean']:.4f} | "
              f"{r['logprob_diff_p99']:.3f} | {r['logprob_diff_max']:.3f} | {r['tool_turn_logprob_diff_mean']:.3f} | {r['step_s']} |")



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", required=True, help="rollgate serve's URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--db", required=True, help="rollgate serve's embedded store (its --db)")
    ap.add_argument("--rollgate", default="rollgate", help="the rollgate binary (for `rollgate bridge`)")
    ap.add_argument("--vllm", required=True, help="vLLM's base URL (…/v1), for load_lora_adapter")
    ap.add_argument("--model-dir", required=True, help="the Hugging Face folder vLLM serves")
    ap.add_argument("--policy-model", default="policy", help="the LoRA adapter's name in vLLM: the model the agents call")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--tasks", type=int, default=4, help="tasks (GRPO groups) per step")
    ap.add_argument("--group-size", type=int, default=4, help="rollouts per task")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--loss-turns", choices=["answer", "all"], default="answer",
                    help="turns whose tokens enter the loss: 'answer' (default) leaves out the tool-call turns, which vLLM "
                         "samples under its structured output (a grammar-masked distribution the trainer cannot compute); "
                         "'all' trains on every turn (the first two 15-step runs: the tool-call turns drifted and the reward collapsed)")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="folder for adapters, batches, steps.jsonl and reward.png")
    ap.add_argument("--admin-token", default=os.environ.get("ROLLGATE_ADMIN_TOKEN"))
    ap.add_argument("--report-only", action="store_true", help="draw reward.png and print the table from OUT/steps.jsonl, then exit")
    args = ap.parse_args()
    if args.report_only:
        report([json.loads(line) for line in open(os.path.join(args.out, "steps.jsonl"))], args.out)
        return
    args.vllm = args.vllm.rstrip("/")

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from verl import DataProto
    from verl.trainer.ppo import core_algos

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    gw = rollgate.Gateway(args.gateway, token=args.admin_token)

    base = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
                                            target_modules=LORA_TARGETS))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)

    adapter = os.path.join(args.out, "adapters", "step-0")
    model.save_pretrained(adapter)  # B = 0: the base policy
    set_policy(args, args.gateway, os.path.abspath(adapter), 0)

    rows = []
    seed = args.seed * 100000
    for step in range(1, args.steps + 1):
        t_step = time.monotonic()
        version = step - 1
        leases = []
        for _ in range(args.tasks):
            secret = random.randint(10, 99)
            gw.enqueue([{"task_id": f"secret-{secret}", "input": {"secret": secret}, "lease_s": 3600} for _ in range(args.group_size)])
            for _ in range(args.group_size):
                leases.append(gw.dequeue(worker_id="train-cpu"))
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(leases)) as ex:
            futs = []
            for lease in leases:
                seed += 2
                futs.append(ex.submit(episode, lease, args.policy_model, seed))
            eps = [f.result() for f in futs]
        t_roll = time.monotonic() - t0
        for e in eps:
            gw.reward(e["rollout_id"], e["reward"], attempt_id=e["attempt_id"])
            gw.status(e["rollout_id"], "succeeded", attempt_id=e["attempt_id"], worker_id="train-cpu")
        ids = [e["rollout_id"] for e in eps]
        for e in eps:
            wait_captured(gw, [e["rollout_id"]], e["calls"])

        path = os.path.join(args.out, "batches", f"step-{step}.safetensors")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        summary = subprocess.run([args.rollgate, "bridge", "--db", args.db, "--rollouts", ",".join(ids),
                                  "--estimator", "grpo", "--air=false", "--out", path],
                                 capture_output=True, text=True)
        if summary.returncode != 0:
            sys.exit(f"rollgate bridge failed:\n{summary.stderr}")
        data = DataProto.from_dict(*rollgate.load_batch(path, backend="torch"))
        b = data.batch
        mask = b["response_mask"]
        versions = set(data.non_tensor_batch["policy_version"].tolist())
        assert versions == {str(version)}, f"step {step}: calls served by policy versions {versions}, want {version}"
        ncalls = sum(e["calls"] for e in eps)
        assert len(data) == ncalls, f"step {step}: {len(data)} samples for {ncalls} calls\n{summary.stderr}"

        # verl's GRPO over the step's rows (each rollout's two calls share
        # its reward: the mean is the rollouts', the std the rows').
        adv, _ = core_algos.compute_grpo_outcome_advantage(b["token_level_rewards"], mask, data.non_tensor_batch["uid"])
        t0 = time.monotonic()
        model.train()
        with torch.no_grad():  # verl's recompute mode: old_log_probs from the trainer
            old = torch.cat([response_logprobs(model, b, mb) for mb in micro_batches(len(data))])
        engine = b["rollout_log_probs"]
        # Split by turn (the agent names its calls with x-agent-name): the
        # tool-call turns are sampled under vLLM's structured output, whose
        # returned logprobs are of the constrained distribution; the answers
        # are sampled freely.
        names = data.non_tensor_batch["agent_name"]
        answer_rows = torch.tensor([n == "answerer" for n in names])
        d_all = (old - engine).abs()
        diff = d_all[mask.bool() & answer_rows.unsqueeze(1)].numpy()
        diff_tool = d_all[mask.bool() & ~answer_rows.unsqueeze(1)].numpy()
        # The loss's mask: with --loss-turns answer the tool-call turns'
        # tokens are left out (counted in the step's row as masked_tokens).
        loss_mask = mask * answer_rows.unsqueeze(1).to(mask.dtype) if args.loss_turns == "answer" else mask
        masked_tokens = int(mask.sum() - loss_mask.sum())
        # verl's clipped policy loss, token-mean over the whole step: each
        # micro-batch's token-mean weighted by its share of the step's tokens
        # (gradients accumulated), as verl's actor does over micro-batches.
        opt.zero_grad()
        total = loss_mask.sum()
        loss_sum = 0.0
        # A step whose groups all have equal rewards has advantages of 0 and
        # no gradient: it is skipped, since AdamW would still move the
        # adapter on its momentum (what made the first 15-step run drift).
        updated = bool((adv[loss_mask.bool()] != 0).any())
        for mb in micro_batches(len(data)) if updated else []:  # not `rows`: that holds the steps' results
            new = response_logprobs(model, b, mb)
            m = loss_mask[mb]
            l, clipfrac, kl, _ = core_algos.compute_policy_loss(old[mb], new, adv[mb], m, cliprange=0.2,
                                                                 loss_agg_mode="token-mean")
            (l * m.sum() / total).backward()
            loss_sum += float(l.detach()) * float(m.sum() / total)
        if updated:
            opt.step()
        loss = torch.tensor(loss_sum)
        t_train = time.monotonic() - t0

        adapter = os.path.abspath(os.path.join(args.out, "adapters", f"step-{step}"))
        model.save_pretrained(adapter)
        before = probe(args)
        t_update = set_policy(args, args.gateway, adapter, step)
        after = probe(args)
        # The new weights reached the engine: its logprobs of the probe moved.
        update_delta = max(abs(a - b) for a, b in zip(after, before))
        if updated and update_delta == 0:
            sys.exit(f"step {step}: the engine's logprobs did not change after loading {adapter}: the update did not reach vLLM")

        rewards = np.array([e["reward"] for e in eps])
        row = {
            "step": step, "policy_version": version, "episodes": len(eps), "samples": len(data),
            "calls": ncalls, "tool_calls": sum(e["tool_calls"] for e in eps),
            "episodes_with_tool_call": sum(1 for e in eps if e["tool_calls"]),
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "starts_with_number": float((rewards == 1.0).mean()),
            "logprob_diff_mean": float(diff.mean()), "logprob_diff_p99": float(np.percentile(diff, 99)),
            "logprob_diff_max": float(diff.max()),
            "tool_turn_logprob_diff_mean": float(diff_tool.mean()) if diff_tool.size else None,
            "loss": float(loss.detach()), "loss_turns": args.loss_turns, "masked_tokens": masked_tokens, "rollout_s": round(t_roll, 1), "train_s": round(t_train, 1),
            "update_s": round(t_update, 1), "engine_probe_delta": update_delta, "updated": updated, "step_s": round(time.monotonic() - t_step, 1),
            "example_answer": eps[0]["answer"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(args.out, "steps.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")

    report(rows, args.out)

if __name__ == "__main__":
    main()
