"""A two-step smoke run of examples/train-cpu (issue 29, items 3 and 5).

The whole loop on the real parts, small: OpenAI SDK agents with a tool call
through rollgate serve against the real vLLM, rewards and statuses through the
task API, rollgate bridge batches as verl DataProto, verl's GRPO and policy
loss, a LoRA update in torch, the adapter loaded into vLLM between rollgate's
pause and resume, and the new policy_version recorded by every later call.
train.py itself asserts the policy versions of each batch and that each update
changed the engine's logprobs; this test checks what it wrote.
"""

import json
import os
import subprocess
import sys

from conftest import REPO


def test_train_cpu_two_steps(gateway, vllm, tmp_path):
    url, model_dir, _ = vllm
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "train-cpu", "train.py"),
         "--gateway", gateway.url, "--db", gateway.db, "--rollgate", gateway.binary,
         "--vllm", url, "--model-dir", model_dir, "--out", str(out),
         "--steps", "2", "--tasks", "2", "--group-size", "2", "--seed", "1",
         "--policy-model", "smoke-policy"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(REPO, "python")},
    )
    print(p.stdout[-3000:])
    assert p.returncode == 0, f"train.py failed ({p.returncode}):\n{p.stderr[-5000:]}"
    rows = [json.loads(line) for line in open(out / "steps.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    # Step 1's calls were served by the first policy, step 2's by the one
    # step 1 trained (train.py checks every sample's policy_version).
    assert [r["policy_version"] for r in rows] == [0, 1]
    for r in rows:
        assert r["episodes"] == 4 and r["samples"] == r["calls"] >= 4, r
        # A step with any nonzero advantage updates the adapter, and the
        # engine's logprobs must then move; an all-equal step is skipped.
        if r["updated"]:
            assert r["engine_probe_delta"] > 0, f"step {r['step']}: the update did not change the engine's logprobs"
        else:
            assert r["loss"] == 0, r
    assert (out / "reward.png").stat().st_size > 1000
    assert (out / "adapters" / "step-2" / "adapter_config.json").exists()
