// Renders every chat template of tests/data/chat_templates/ over a fixed
// set of conversations with @huggingface/jinja (add_generation_prompt=true)
// and writes tests/data/chat_templates/expected.json, the reference that
// tests/unit/test_chat.c holds kvferry's built-in renderers to.
//
// Usage (the engine is not a dependency of the repo; install it aside):
//   mkdir -p /tmp/jinja-scratch && (cd /tmp/jinja-scratch && npm install @huggingface/jinja)
//   NODE_PATH=/tmp/jinja-scratch/node_modules node tools/chatref/render.mjs
// or pass the engine's directory as the first argument.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const dataDir = join(here, "..", "..", "tests", "data", "chat_templates");
const enginePath = process.argv[2] || process.env.NODE_PATH || "/tmp/jinja-scratch/node_modules";
const require = createRequire(join(enginePath, "noop.js"));
const { Template } = require("@huggingface/jinja");
const engineVersion = JSON.parse(
  readFileSync(join(enginePath, "@huggingface", "jinja", "package.json"), "utf8"),
).version;

// Each template with the special tokens of its family's tokenizer_config.json
// (null: the family has none; the variable is then left undefined).
const templates = [
  { name: "llama2", bos_token: "<s>", eos_token: "</s>" },
  { name: "llama3", bos_token: "<|begin_of_text|>", eos_token: "<|end_of_text|>" },
  { name: "llama3_1", bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>" },
  { name: "mistral_v0_1", bos_token: "<s>", eos_token: "</s>" },
  { name: "mistral_v0_2", bos_token: "<s>", eos_token: "</s>" },
  { name: "mistral_v0_3", bos_token: "<s>", eos_token: "</s>" },
  { name: "qwen2_5", bos_token: null, eos_token: "<|im_end|>" },
  { name: "qwen3", bos_token: null, eos_token: "<|im_end|>" },
  { name: "gemma", bos_token: "<bos>", eos_token: "<eos>" },
  { name: "gemma2", bos_token: "<bos>", eos_token: "<eos>" },
];

const u = (content) => ({ role: "user", content });
const a = (content) => ({ role: "assistant", content });
const s = (content) => ({ role: "system", content });

const conversations = [
  { name: "single_user", messages: [u("Hello, who are you?")] },
  { name: "system_user", messages: [s("You are a terse assistant."), u("Name three primes.")] },
  {
    name: "multi_turn",
    messages: [u("Hi there"), a("Hello! How can I help?"), u("Tell me a joke.")],
  },
  {
    name: "system_multi_turn",
    messages: [
      s("Answer in French."),
      u(" What is the capital of Italy? "),
      a("  Rome.  "),
      u("And of Spain?"),
    ],
  },
  {
    name: "think",
    messages: [
      u("What is 2+2?"),
      a("<think>\nThe user adds two and two.\n</think>\n\n2 + 2 = 4."),
      u("And 3+3?"),
    ],
  },
  {
    name: "think_multi",
    messages: [
      s("Think step by step."),
      u("First question"),
      a("<think>\n\nfirst thought\n\n</think>\n\nFirst answer"),
      u("Second question"),
      a("No thinking here"),
      u("Third question"),
      a("<think>a</think>middle</think>\n  last part\n"),
      u("Fourth question"),
    ],
  },
  {
    name: "unicode_newlines",
    messages: [
      s(" Réponds en 日本語.\n"),
      u("  Grüße aus Zürich 🙂\n\n  第二行：你好，世界\n"),
      a("\u3000Ça va — très bien.\u00a0\n"),
      u("\tMerci !\r\nÀ bientôt 👋🏽\n"),
    ],
  },
  {
    name: "unicode_no_system",
    messages: [u(" \u00a0Grüße 🙂\n第二行\u3000"), a("\nÇa va — très bien.\n\n"), u("À bientôt\r\n")],
  },
  { name: "empty_user", messages: [u("")] },
  { name: "empty_turns", messages: [s(""), u(""), a(""), u("")] },
  { name: "user_user", messages: [u("one"), u("two")] },
  {
    name: "assistant_last",
    messages: [
      u("Continue your answer."),
      a("<think>\n first \n</think>\n<think> second\n\n</think>\n\n Partial answer \n"),
    ],
  },
];

const renderings = [];
for (const t of templates) {
  const source = readFileSync(join(dataDir, `${t.name}.jinja`), "utf8");
  const template = new Template(source);
  for (const c of conversations) {
    const vars = { messages: c.messages, add_generation_prompt: true };
    if (t.bos_token !== null) vars.bos_token = t.bos_token;
    if (t.eos_token !== null) vars.eos_token = t.eos_token;
    const r = { template: t.name, conversation: c.name };
    try {
      r.text = template.render(vars);
    } catch (e) {
      r.error = String(e.message || e);
    }
    renderings.push(r);
  }
}

const out = {
  generator: "tools/chatref/render.mjs",
  engine: `@huggingface/jinja ${engineVersion}`,
  add_generation_prompt: true,
  templates,
  conversations,
  renderings,
};
writeFileSync(join(dataDir, "expected.json"), JSON.stringify(out, null, 1) + "\n");
console.log(`${renderings.length} renderings (${renderings.filter((r) => r.error).length} refused)`);
