// The official `openai` Node.js client against kvf-router's HTTP API (run
// by http.sh after `npm install openai`): completions and chat, streaming
// and not; greedy text must equal the colocated `kvf generate` output that
// http.sh passes in KVF_REF_TEXT (prompt "The quick brown fox", 12 tokens)
// and KVF_REF_CHAT (the ChatML rendering of one user message "Say hi",
// 10 tokens). Exits non-zero on any difference.
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.KVF_BASE_URL,
  apiKey: process.env.KVF_API_KEY,
  timeout: 60000,
  maxRetries: 0,
});
const model = process.env.KVF_MODEL;
const refText = process.env.KVF_REF_TEXT;
const refChat = process.env.KVF_REF_CHAT;
let failures = 0;

function check(what, got, want) {
  if (got !== want) {
    console.error(`FAIL ${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
    failures++;
  } else {
    console.log(`ok: node openai ${what}`);
  }
}

// Shell command substitution drops trailing newlines: compare likewise.
const trim = (s) => s.replace(/\n+$/, "");
const extra = { ignore_eos: true };

const models = await client.models.list();
check("models.list", models.data.map((m) => m.id).join(","), model);

const c = await client.completions.create({
  model, prompt: "The quick brown fox", max_tokens: 12, temperature: 0, ...extra,
});
check("completions text", trim(c.choices[0].text), refText);
check("completions finish_reason", c.choices[0].finish_reason, "length");
check("completions usage", c.usage.completion_tokens, 12);

let streamed = "";
let usage = null;
const cs = await client.completions.create({
  model, prompt: "The quick brown fox", max_tokens: 12, temperature: 0, stream: true,
  stream_options: { include_usage: true }, ...extra,
});
for await (const chunk of cs) {
  if (chunk.choices.length) streamed += chunk.choices[0].text;
  if (chunk.usage) usage = chunk.usage;
}
check("completions stream text", trim(streamed), refText);
check("completions stream usage", usage && usage.total_tokens, usage && usage.prompt_tokens + 12);

const messages = [{ role: "user", content: "Say hi" }];
const chat = await client.chat.completions.create({
  model, messages, max_tokens: 10, temperature: 0, ...extra,
});
check("chat content", trim(chat.choices[0].message.content), refChat);
check("chat role", chat.choices[0].message.role, "assistant");

let chatStreamed = "";
let finish = null;
const chs = await client.chat.completions.create({
  model, messages, max_tokens: 10, temperature: 0, stream: true, ...extra,
});
for await (const chunk of chs) {
  const ch = chunk.choices[0];
  chatStreamed += ch.delta.content ?? "";
  if (ch.finish_reason) finish = ch.finish_reason;
}
check("chat stream content", trim(chatStreamed), refChat);
check("chat stream finish_reason", finish, "length");

try {
  await client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 1 });
  console.error("FAIL unknown model accepted");
  failures++;
} catch (err) {
  check("unknown model status", err.status, 400);
}
const bad = new OpenAI({ baseURL: process.env.KVF_BASE_URL, apiKey: "wrong", maxRetries: 0 });
try {
  await bad.models.list();
  console.error("FAIL wrong key accepted");
  failures++;
} catch (err) {
  check("wrong key status", err.status, 401);
}
process.exit(failures ? 1 : 0);
