"""The retokenisation experiment (issue 29, item 4): what a trainer that
retokenises text would train on, against the engine's own ids.

From one rollgate store, two batches of the same captured calls:

  engine:      rollgate bridge --db DB --out engine.safetensors
  retokenized: rollgate bridge --db DB --out retokenized.safetensors \\
                   --retokenize MODEL_DIR --retokenize-all

(the second rebuilds every call's ids from its request messages and answer
with the model's chat template and tokenizer, as a text-based trainer does;
its samples are token_source retokenized and carry no engine logprobs).
Samples are matched by (rollout_id, sequence ids). Reported:

- the share of samples whose prompt ids, response ids, or any ids differ;
- engine batch: per token |trainer - engine logprob| (mean, p99, max), the
  trainer being the policy that served the call (the base model plus the
  LoRA adapter of the call's policy_version, in float32) on the batch's ids;
- retokenized batch: (a) per token |trainer - engine logprob| over the
  samples whose retokenized response ids equal the engine's (the engine's
  logprobs belong to the engine's tokens, so only there are they
  comparable token by token); (b) per sample |sum of trainer logprobs over
  the retokenized response - sum of engine logprobs over the engine
  response| (the sequence log-likelihood a policy gradient weighs), with
  the engine batch's own per-sample figure beside it;
- every kind of difference: the first differing ids of each sample, decoded,
  counted by kind.

Writes OUT/report.json and OUT/report.md. Run in the trainer environment:

  PYTHONPATH=python "$(scripts/pyenv trainer)/bin/python" \\
      examples/train-cpu/retokenize_experiment.py --db train-cpu-out/rollgate.db \\
      --model-dir MODEL_DIR --adapters train-cpu-out/adapters --rollgate ./rollgate --out retok-out
"""

import argparse
import collections
import json
import os
import subprocess
import sys

import numpy as np
import torch

import rollgate

MICRO_BATCH = 4


def bridge(args, out, *extra):
    cmd = [args.rollgate, "bridge", "--db", args.db, "--out", out, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return cmd, p.stderr


def samples(path):
    """(rollout_id, sequence ids) -> the sample's unpadded ids, the batch and
    its row."""
    t, n, _ = rollgate.load_batch(path, backend="torch")
    P = t["prompts"].shape[1]
    out = {}
    for i in range(t["prompts"].shape[0]):
        if n["padding"][i]:
            continue
        am = t["attention_mask"][i].bool()
        key = (n["rollout_id"][i], tuple(int(s) for s in n["sequence_ids"][i]), int(n["choice_index"][i]))
        out[key] = {
            "row": i,
            "prompt": t["prompts"][i][am[:P]].tolist(),
            "response": t["responses"][i][am[P:]].tolist(),
            "policy_version": n["policy_version"][i],
            "token_source": n["token_source"][i],
        }
    return t, n, out


def policy(model_dir, adapters, version):
    """The weights that served policy_version: the base model plus
    adapters/step-VERSION (merged), or the base alone without --adapters."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapters:
        from peft import PeftModel

        m = PeftModel.from_pretrained(m, os.path.join(adapters, f"step-{version}")).merge_and_unload()
    return m.eval()


def trainer_logprobs(t, n, model_dir, adapters):
    """log p(response token | prefix) for every row, each under the policy
    version that served it, from the batch's own ids: [B, R]."""
    B, R = t["responses"].shape
    out = torch.zeros(B, R)
    by_version = collections.defaultdict(list)
    for i in range(B):
        by_version[n["policy_version"][i]].append(i)
    for v, rows_all in sorted(by_version.items()):
        model = policy(model_dir, adapters, v)
        with torch.no_grad():
            for k in range(0, len(rows_all), MICRO_BATCH):
                rows = rows_all[k : k + MICRO_BATCH]
                logits = model(input_ids=t["input_ids"][rows], attention_mask=t["attention_mask"][rows],
                               position_ids=t["position_ids"][rows], logits_to_keep=R + 1).logits[:, :-1, :].float()
                out[rows] = -torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), t["responses"][rows].reshape(-1), reduction="none"
                ).view(len(rows), R)
        del model
    return out


def stats(x):
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return {"n": 0, "mean": None, "p99": None, "max": None}
    return {"n": int(x.size), "mean": float(x.mean()), "p99": float(np.percentile(x, 99)), "max": float(x.max())}


def first_diff(a, b):
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


def explain(tok, a, b):
    """What differs between engine ids a and retokenized ids b: the kind and
    the differing stretch, decoded."""
    i = first_diff(a, b)
    ta, tb = tok.decode(a, skip_special_tokens=False), tok.decode(b, skip_special_tokens=False)
    # The differing stretches after the common prefix (and before a common suffix).
    j = 0
    while j < min(len(a), len(b)) - i and a[len(a) - 1 - j] == b[len(b) - 1 - j]:
        j += 1
    da, db = a[i : len(a) - j], b[i : len(b) - j]
    sa, sb = tok.decode(da, skip_special_tokens=False), tok.decode(db, skip_special_tokens=False)
    special = set(tok.all_special_ids)
    if ta == tb:
        kind = "same text, other token split (merge)"
    elif any(x in special for x in da + db) and tok.decode([x for x in da if x not in special]) == tok.decode([x for x in db if x not in special]):
        kind = "special tokens only"
    else:
        kind = "different text"
    return {"kind": kind, "at": i, "engine": sa, "retokenized": sb, "engine_ids": da[:40], "retokenized_ids": db[:40]}


def turn_of(tok, prompt):
    """tool-call turn (the first call, before any tool result) or answer
    turn (a tool result in the prompt)."""
    return "answer" if "<|im_start|>tool" in tok.decode(prompt, skip_special_tokens=False) else "tool-call"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="rollgate's embedded store (read only)")
    ap.add_argument("--model-dir", required=True, help="the Hugging Face folder the engine served")
    ap.add_argument("--adapters", default="", help="folder of step-N LoRA adapters (train.py's OUT/adapters): policy_version N is the base plus step-N")
    ap.add_argument("--rollgate", default="rollgate", help="the rollgate binary")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model_dir)

    pe, pr = os.path.join(args.out, "engine.safetensors"), os.path.join(args.out, "retokenized.safetensors")
    cmd_e, sum_e = bridge(args, pe)
    cmd_r, sum_r = bridge(args, pr, "--retokenize", args.model_dir, "--retokenize-all")
    te, ne, se = samples(pe)
    tr, nr, sr = samples(pr)
    assert all(s["token_source"] == "engine" for s in se.values()), "engine batch holds non-engine ids"
    assert all(s["token_source"] == "retokenized" for s in sr.values()), "retokenized batch holds engine ids"
    assert "rollout_log_probs" not in tr, "the retokenized batch carries logprobs"

    lp_e = trainer_logprobs(te, ne, args.model_dir, args.adapters)
    lp_r = trainer_logprobs(tr, nr, args.model_dir, args.adapters)
    eng = te["rollout_log_probs"]

    keys = sorted(se)
    both = [k for k in keys if k in sr]
    only_engine = [k for k in keys if k not in sr]
    per_turn = collections.defaultdict(lambda: collections.defaultdict(list))
    kinds = collections.Counter()
    examples = {}
    diff_prompt = diff_resp = diff_any = 0
    for k in keys:
        e = se[k]
        turn = turn_of(tok, e["prompt"])
        T = per_turn[turn]
        T["samples"].append(1)
        R = len(e["response"])
        lpe = lp_e[e["row"], :R].numpy()
        en = eng[e["row"], :R].numpy()
        T["engine_token"].extend(np.abs(lpe - en).tolist())
        T["engine_sum"].append(abs(float(lpe.sum() - en.sum())))
        if k not in sr:
            continue
        r = sr[k]
        dp, dr = e["prompt"] != r["prompt"], e["response"] != r["response"]
        diff_prompt += dp
        diff_resp += dr
        diff_any += dp or dr
        T["prompt_differs"].append(int(dp))
        T["response_differs"].append(int(dr))
        Rr = len(r["response"])
        lpr = lp_r[r["row"], :Rr].numpy()
        if not dr:
            T["retok_token_same_response"].extend(np.abs(lpr - en).tolist())
        T["retok_sum"].append(abs(float(lpr.sum() - en.sum())))
        for part, a, b in (("prompt", e["prompt"], r["prompt"]), ("response", e["response"], r["response"])):
            if a != b:
                x = explain(tok, a, b)
                sig = (turn, part, x["kind"])
                kinds[sig] += 1
                ex = examples.setdefault(sig, [])
                if len(ex) < 3:
                    ex.append({"sample": list(map(str, k[:2])), **x})

    def share(x, n):
        return {"count": int(x), "of": n, "share": x / n if n else None}

    n = len(both)
    report = {
        "db": args.db,
        "commands": {"engine": " ".join(cmd_e), "retokenized": " ".join(cmd_r)},
        "bridge_summaries": {"engine": sum_e.strip().splitlines()[1:], "retokenized": sum_r.strip().splitlines()[1:]},
        "samples": {"engine": len(se), "retokenized": len(sr), "matched": n, "engine_only": [list(map(str, k[:2])) for k in only_engine]},
        "prompt_ids_differ": share(diff_prompt, n),
        "response_ids_differ": share(diff_resp, n),
        "any_ids_differ": share(diff_any, n),
        "by_turn": {},
        "differences": [{"count": c, "turn": s[0], "part": s[1], "kind": s[2], "examples": examples[s]} for s, c in kinds.most_common()],
    }
    allt = collections.defaultdict(list)
    for turn, T in sorted(per_turn.items()):
        for key, v in T.items():
            allt[key].extend(v)
    for turn, T in list(sorted(per_turn.items())) + [("all", allt)]:
        m = len(T["prompt_differs"])
        report["by_turn"][turn] = {
            "samples": len(T["samples"]),
            "matched": m,
            "prompt_ids_differ": share(sum(T["prompt_differs"]), m),
            "response_ids_differ": share(sum(T["response_differs"]), m),
            "engine_per_token": stats(T["engine_token"]),
            "engine_per_sample_sum": stats(T["engine_sum"]),
            "retokenized_per_token_where_response_ids_equal": stats(T["retok_token_same_response"]),
            "retokenized_per_sample_sum": stats(T["retok_sum"]),
        }
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)

    def f3(s, key):
        v = s[key]
        return "-" if v is None else f"{v:.4f}"

    lines = [f"Store `{args.db}`: {len(se)} engine samples, {len(sr)} retokenized, {n} matched"
             + (f" ({len(only_engine)} engine samples could not be retokenized: {report['samples']['engine_only']})" if only_engine else "") + ".", "",
             "| turn | samples | prompt ids differ | response ids differ | engine batch: per token mean / p99 / max | engine batch: per sample sum, mean / p99 / max "
             "| retokenized, per token where response ids equal (tokens): mean / p99 / max | retokenized, per sample sum: mean / p99 / max |",
             "|---|---|---|---|---|---|---|---|"]
    for turn, s in report["by_turn"].items():
        def trio(x):
            return f"{f3(x, 'mean')} / {f3(x, 'p99')} / {f3(x, 'max')}"
        lines.append(f"| {turn} | {s['matched']} | {s['prompt_ids_differ']['count']} ({s['prompt_ids_differ']['share'] or 0:.0%}) "
                     f"| {s['response_ids_differ']['count']} ({s['response_ids_differ']['share'] or 0:.0%}) "
                     f"| {trio(s['engine_per_token'])} | {trio(s['engine_per_sample_sum'])} "
                     f"| ({s['retokenized_per_token_where_response_ids_equal']['n']}) {trio(s['retokenized_per_token_where_response_ids_equal'])} "
                     f"| {trio(s['retokenized_per_sample_sum'])} |")
    lines += ["", f"Samples whose ids differ at all: {diff_any}/{n} ({diff_any / n if n else 0:.0%}).", "",
              "| samples | turn | part | kind | example: engine's differing stretch (decoded, ids) | retokenized stretch (decoded, ids) |",
              "|---|---|---|---|---|---|"]
    for d in report["differences"]:
        x = d["examples"][0]
        lines.append(f"| {d['count']} | {d['turn']} | {d['part']} | {d['kind']} "
                     f"| `{json.dumps(x['engine'], ensure_ascii=False)[:100]}` {x['engine_ids'][:12]} "
                     f"| `{json.dumps(x['retokenized'], ensure_ascii=False)[:100]}` {x['retokenized_ids'][:12]} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
