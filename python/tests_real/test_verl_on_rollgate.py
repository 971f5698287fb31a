"""verl's own code on rollgate's batches of real engine data (issue 29, item 2).

Agents written with the OpenAI Python SDK call a real vLLM (CPU, SmolLM2-135M-
Instruct in bfloat16) through `rollgate serve`; rewards are posted through the
task API; `rollgate bridge` writes safetensors batches. Then, in this process:

- verl's DataProto.from_dict takes rollgate.load_batch's three values as they are;
- verl's own GRPO, Dr.GRPO, RLOO and REINFORCE++-baseline estimators
  (verl.trainer.ppo.core_algos, verl 0.9.1) run on the batch's
  token_level_rewards, response_mask and uid and give the advantages the bridge
  wrote (one call per rollout, so verl's per-row groups are the bridge's
  rollouts);
- the same model, loaded by HF transformers in float32, recomputes the logprob
  of every response token from the batch's input_ids; the difference to the
  engine's captured rollout_log_probs (verl's "rollout/training probability
  difference") is reported and bounded.

Numbers go to stdout (pytest -s) and to $ROLLGATE_REPORT_DIR/verl_real.json
when that is set.
"""

import json
import os
import time

import numpy as np
import pytest

import rollgate

TASKS = {
    "count": "Count from one to five in words.",
    "capital": "Name the capital of France in one word.",
}
ROLLOUTS_PER_TASK = 4


def _reward(text):
    """A deterministic reward with spread inside a group: the share of the
    answer's first 16 characters that are letters."""
    head = text[:16]
    return sum(c.isalpha() for c in head) / 16 if head else 0.0


def _collect(gateway, model, seed0=0):
    """Runs ROLLOUTS_PER_TASK rollouts of each task (one enqueue per task: one
    group each), one chat call per rollout, and posts rewards and statuses.
    Returns {rollout_id: reward}."""
    from openai import OpenAI

    gw = rollgate.Gateway(gateway.url)
    rewards = {}
    seed = seed0
    for task_id, prompt in TASKS.items():
        gw.enqueue([{"task_id": task_id, "input": {"prompt": prompt}, "lease_s": 3600} for _ in range(ROLLOUTS_PER_TASK)])
        for _ in range(ROLLOUTS_PER_TASK):
            lease = gw.dequeue(worker_id="pytest")
            assert lease is not None, "the queue gave no task"
            client = OpenAI(base_url=lease["base_url"], api_key="unused", timeout=300, max_retries=0)
            seed += 1
            out = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": lease["input"]["prompt"]}],
                max_tokens=12,
                temperature=1.0,
                seed=seed,
            )
            text = out.choices[0].message.content or ""
            r = _reward(text)
            rewards[lease["rollout_id"]] = r
            gw.reward(lease["rollout_id"], r, attempt_id=lease["attempt_id"])
            gw.status(lease["rollout_id"], "succeeded", attempt_id=lease["attempt_id"], worker_id="pytest")
    # Capture is asynchronous: wait until the store holds every call before
    # the bridge reads it.
    deadline = time.monotonic() + 120
    for r in rewards:
        while len(gw.rollout(r).get("calls") or []) < 1:
            assert time.monotonic() < deadline, f"the call of {r} was not stored in 120s"
            time.sleep(0.05)  # polling the rollout read: the store cannot tell us
    return rewards


def _load(path):
    from verl import DataProto

    tensors, non_tensors, meta = rollgate.load_batch(path, backend="torch")
    return DataProto.from_dict(tensors, non_tensors, meta)


def _verl_advantages(name, data):
    import torch
    from verl.trainer.ppo import core_algos

    b = data.batch
    index = data.non_tensor_batch["uid"]
    rewards, mask = b["token_level_rewards"], b["response_mask"]
    if name == "grpo":
        adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
    elif name == "drgrpo":
        adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    elif name == "rloo":
        adv, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, index)
    elif name == "reinforce++-baseline":
        adv, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index)
    else:
        raise ValueError(name)
    assert isinstance(adv, torch.Tensor)
    return adv


def _report(name, value):
    d = os.environ.get("ROLLGATE_REPORT_DIR")
    print(f"\n{name}: {json.dumps(value, indent=1)}")
    if d:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name + ".json"), "w") as f:
            json.dump(value, f, indent=1)


def _trainer_logprobs(model_dir, data):
    """log p(response token | everything before it) under the model in float32,
    from the batch's own input_ids, attention_mask and position_ids (no text,
    no tokenizer): [B, R]."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    b = data.batch
    R = b["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits.float()
    # Token t of the response is predicted by the logits at position P + t - 1.
    logits = logits[:, -R - 1 : -1, :]
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def test_verl_estimators_and_logprobs_on_real_engine_batches(gateway, vllm, tmp_path):
    url, model_dir, model = vllm
    rewards = _collect(gateway, model)
    assert len(rewards) == len(TASKS) * ROLLOUTS_PER_TASK
    # Rewards must vary inside a group, or every advantage is 0 and the
    # comparison below would hold for any estimator.
    assert len(set(rewards.values())) > 2, f"rewards without spread: {rewards}"

    results = {}
    for est in ["grpo", "drgrpo", "rloo", "reinforce++-baseline"]:
        out = str(tmp_path / f"{est}.safetensors")
        summary = gateway.bridge("--estimator", est, "--air=false", "--out", out)
        data = _load(out)
        b = data.batch
        n = len(data)
        assert n == len(rewards), f"{est}: {n} samples for {len(rewards)} rollouts\n{summary}"
        assert set(data.non_tensor_batch["rollout_id"]) == set(rewards)
        # Every sample's ids came from the engine: nothing retokenised.
        assert all(s == "engine" for s in data.non_tensor_batch["token_source"]), data.non_tensor_batch["token_source"]
        # The episode reward is where verl reads it: the sum of token_level_rewards.
        for i, ro in enumerate(data.non_tensor_batch["rollout_id"]):
            assert abs(float(b["token_level_rewards"][i].sum()) - rewards[ro]) < 1e-6, (ro, rewards[ro])
        want = _verl_advantages(est, data)
        mask = b["response_mask"].bool()
        got = b["advantages"]
        diff = (got - want).abs()[mask]
        results[est] = {"samples": n, "max_abs_diff": float(diff.max()), "nonzero": int((want[mask] != 0).sum())}
        assert results[est]["nonzero"] > 0, f"{est}: verl's advantages are all 0"
        assert float(diff.max()) < 1e-5, f"{est}: rollgate's advantages differ from verl's by {float(diff.max())}"
    _report("verl_estimators", results)

    # The trainer's logprobs (transformers, float32) against the engine's
    # (vLLM, bfloat16), token by token on the same ids.
    data = _load(str(tmp_path / "grpo.safetensors"))
    b = data.batch
    mask = b["response_mask"].bool()
    trainer = _trainer_logprobs(model_dir, data)
    engine = b["rollout_log_probs"]
    d = (trainer - engine).abs()[mask].numpy()
    stats = {
        "tokens": int(d.size),
        "mean": float(d.mean()),
        "p50": float(np.percentile(d, 50)),
        "p90": float(np.percentile(d, 90)),
        "p99": float(np.percentile(d, 99)),
        "max": float(d.max()),
        "engine_mean_logprob": float(engine[mask].mean()),
        "trainer_mean_logprob": float(trainer[mask].mean()),
        "engine_dtype": "bfloat16 (vLLM's CPU default for a float32 checkpoint)",
        "trainer_dtype": "float32",
    }
    _report("verl_logprob_diff", stats)
    assert stats["tokens"] >= len(rewards), stats
    # Same model, same ids: the distributions agree up to bfloat16 rounding.
    # A retokenised or misaligned response shows as differences of whole nats.
    assert stats["p50"] < 0.1 and stats["mean"] < 0.25, stats
