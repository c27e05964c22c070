// Reference ids for the tokenizer comparison (tests/integration/tokenizer_ref.sh),
// from Hugging Face's JS tokenizers (@huggingface/tokenizers, installed by
// tools/tokref/fetch.sh).
//
//   node tools/tokref/reference.mjs CORPUS.jsonl TOKENIZER_DIR > FAMILY.ref.jsonl
//
// CORPUS.jsonl holds one JSON string a line; TOKENIZER_DIR holds
// tokenizer.json and tokenizer_config.json. Each output line is, for the
// corpus line of the same number,
//   {"ids": encode(s, no special tokens), "ids_special": encode(s, special
//    tokens), "decoded": decode(ids_special, special tokens kept),
//    "decoded_raw": the same with clean_up_tokenization_spaces off}
// with the tokenizer_config.json defaults for everything else ("decoded"
// cleans up spaces where the config says so); an empty id list decodes to
// "". Run it with NODE_PATH naming the
// node_modules that fetch.sh made.
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const [corpusPath, dir] = process.argv.slice(2);
if (!corpusPath || !dir) {
    console.error("usage: node reference.mjs CORPUS.jsonl TOKENIZER_DIR > FAMILY.ref.jsonl");
    process.exit(2);
}
// Resolved through NODE_PATH or the working directory's node_modules.
const require = createRequire(path.join(process.cwd(), "noop.js"));
const lib = await import(require.resolve("@huggingface/tokenizers"));
const Tokenizer = lib.Tokenizer ?? lib.default.Tokenizer; // the CommonJS build under require

const readJson = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
const tok = new Tokenizer(readJson("tokenizer.json"), readJson("tokenizer_config.json"));

const lines = fs.readFileSync(corpusPath, "utf8").split("\n");
if (lines[lines.length - 1] === "")
    lines.pop();
const out = [];
lines.forEach((line, i) => {
    let s;
    try {
        s = JSON.parse(line);
    } catch (e) {
        throw new Error(`${corpusPath}: line ${i + 1} is not JSON: ${e.message}`);
    }
    if (typeof s !== "string")
        throw new Error(`${corpusPath}: line ${i + 1} is not a JSON string`);
    const ids = tok.encode(s, { add_special_tokens: false }).ids;
    const idsSpecial = tok.encode(s, { add_special_tokens: true }).ids;
    // decode refuses an empty list; nothing decodes to the empty string.
    const decode = (opts) => (idsSpecial.length ? tok.decode(idsSpecial, opts) : "");
    const decoded = decode({ skip_special_tokens: false });
    const decodedRaw = decode({ skip_special_tokens: false, clean_up_tokenization_spaces: false });
    out.push(JSON.stringify({ ids, ids_special: idsSpecial, decoded, decoded_raw: decodedRaw }));
});
process.stdout.write(out.join("\n") + "\n");
