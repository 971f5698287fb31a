#!/usr/bin/env python3
"""Load a rollgate batch (safetensors with verl's key names) into PyTorch and
run masked policy-gradient steps on a tiny causal model.

    /usr/bin/python3 examples/trainer/consume.py batch.safetensors [--steps 3] [--lr 0.05]

It prints one JSON line per step and a summary line. The loss is the
REINFORCE / GRPO-style surrogate with importance ratio against the rollout's
log-probs (PPO clipping), averaged over response tokens:

    ratio = exp(logp_new - rollout_log_probs)
    loss  = -mean_{response_mask} min(ratio * A, clip(ratio, 1-eps, 1+eps) * A)

The model is deliberately tiny (an embedding, one GRU layer and an output
head over the batch's vocabulary) so it runs on a CPU in a second; the same
code runs on a GPU with a real model (swap TinyLM for a Hugging Face causal LM
and --device cuda). Safetensors is parsed by hand (8-byte header length, JSON
header, raw little-endian data): no safetensors package is needed.
"""
import argparse
import json
import struct
import sys

import torch

DTYPES = {"I64": torch.int64, "F32": torch.float32, "I32": torch.int32, "F64": torch.float64}


def load_safetensors(path):
    """Returns ({name: tensor}, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        buf = bytearray(data[base + start : base + end])  # frombuffer needs a writable buffer
        t = torch.frombuffer(buf, dtype=dtype) if len(buf) else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    return out, meta


class TinyLM(torch.nn.Module):
    def __init__(self, vocab, dim=32):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.rnn = torch.nn.GRU(dim, dim, batch_first=True)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.head(h)


def response_logprobs(model, batch):
    """Log-probs of each response token given everything before it."""
    ids = batch["input_ids"]
    p = batch["prompts"].shape[1]
    r = batch["responses"].shape[1]
    logits = model(ids)  # [B, P+R, V]
    # The token at position t is predicted at position t-1.
    pred = logits[:, p - 1 : p - 1 + r, :] if p > 0 else logits[:, :r, :]
    logp = torch.log_softmax(pred.float(), dim=-1)
    return logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)  # [B, R]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("batch")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)

    batch, meta = load_safetensors(a.batch)
    # rollout_log_probs is absent when the bridge ran with --logprobs omit.
    required = ["prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask",
                "token_level_rewards", "advantages"]
    missing = [k for k in required if k not in batch]
    if missing:
        sys.exit(f"batch lacks {missing}")
    uids = json.loads(meta.get("uid", "[]"))
    B, R = batch["responses"].shape
    if len(uids) != B:
        sys.exit(f"{len(uids)} uids for {B} samples")
    mask = batch["response_mask"].float()
    adv = batch["advantages"]
    old = batch.get("rollout_log_probs")
    vocab = int(batch["input_ids"].max().item()) + 1
    batch = {k: v.to(a.device) for k, v in batch.items()}
    model = TinyLM(vocab).to(a.device)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    mask, adv = mask.to(a.device), adv.to(a.device)
    old = old.to(a.device) if old is not None else None
    ntok = mask.sum().clamp(min=1)

    first = last = None
    for step in range(a.steps):
        logp = response_logprobs(model, batch)
        # Tokens without rollout log-probs (0 off the mask, or none in the
        # batch: the current policy is then the behaviour policy) use ratio 1.
        behaviour = old if old is not None else logp.detach()
        ratio = torch.exp((logp - behaviour) * mask).detach() * torch.exp(logp - logp.detach())
        surr = torch.min(ratio * adv, torch.clamp(ratio, 1 - a.clip, 1 + a.clip) * adv)
        loss = -(surr * mask).sum() / ntok
        opt.zero_grad()
        loss.backward()
        gnorm = torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in model.parameters() if p.grad is not None))
        opt.step()
        # The policy-gradient objective: the advantage-weighted mean log-prob of the responses.
        objective = ((logp.detach() * adv * mask).sum() / ntok).item()
        rec = {"step": step, "loss": loss.item(), "grad_norm": gnorm.item(), "objective": objective}
        print(json.dumps(rec), flush=True)
        first = first or rec
        last = rec
    with torch.no_grad():
        final = ((response_logprobs(model, batch) * adv * mask).sum() / ntok).item()
    print(json.dumps({
        "samples": B, "response_tokens": int(ntok.item()), "groups": len(set(uids)), "vocab": vocab,
        "objective_before": first["objective"], "objective_after": final, "grad_norm": first["grad_norm"],
        "advantage_abs_sum": float(adv.abs().sum().item()),
    }), flush=True)


if __name__ == "__main__":
    main()
