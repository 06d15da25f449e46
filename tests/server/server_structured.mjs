// Structured outputs (issue 26) through the official openai client, on a random-weight checkpoint:
//  - response_format json_schema for 24 schemas (nested objects, enums, arrays with bounds, anyOf /
//    oneOf, numbers with bounds, strings with lengths, $ref), stream and non-stream, thinking on
//    and off: every output parses and validates (ajv) and ends with finish_reason "stop";
//  - json_object mode, vLLM's guided_json (object and string) and structured_outputs, the
//    completions endpoint, n = 2;
//  - vLLM's guided_regex / guided_choice (and structured_outputs {regex, choice}): every output
//    matches the pattern (JavaScript's RegExp, u flag) or is one of the choices; "pattern" in a
//    schema and in a forced tool call's arguments (ajv);
//  - tool_choice "required" / named: always valid calls of the allowed tools (arguments validated
//    against the tool's parameters), parallel_tool_calls false: exactly one; with tool_choice
//    auto: at most one; strict tools under tool_choice auto: every call valid;
//  - a streamed tool call arrives as vLLM sends one: id, type and name first, then the arguments in
//    several deltas whose concatenation is the non-stream arguments (and validates);
//  - a JSON answer whose strings spell the tool-call markup stays the answer (no tool call);
//  - response and tool-call ids differ across requests, turns and a server restart;
//  - unconstrained greedy requests sharing steps with constrained ones give the tokens they give alone;
//  - 400s naming the problem (a schema keyword the grammar refuses, an unknown tool, conflicts).
// A random model rarely closes a string by itself: the requests bias the closing tokens (" } ]
// and the tool-call namespace) so that outputs end well within max_tokens; the constraint is
// what is tested, the bias only shortens the random text. Thinking on: </mm:think> is biased
// too, so the reasoning ends early and the constrained answer follows.
// Usage: node tests/server/server_structured.mjs <m3-binary> <work-dir>
import OpenAI from 'openai';
import Ajv from 'ajv/dist/2020.js';
import fs from 'node:fs';
import path from 'node:path';
import net from 'node:net';
import { makeCheckpoint, startServer, post, reporter, root, metrics } from './lib.mjs';

const [m3, work] = process.argv.slice(2);
if (!m3 || !work) { console.error('usage: node server_structured.mjs <m3-binary> <work-dir>'); process.exit(2); }
const R = reporter(), ok = R.ok;
const ck = makeCheckpoint(m3, work + '/ck');
// --grammar-threads 1: the mask thread computes the next step's masks while the forward runs (the
// default on a GPU; on the CPU masks are computed as rows are sampled, also run here for first tokens)
const srv = await startServer(m3, ck, ['--served-model-name', 'tiny', '--grammar-threads', '1']);
const base = srv.base;
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'none' });
const ajv = new Ajv({ strict: false, allErrors: true, validateFormats: false }); // formats: checked by hand below (no ajv-formats)
const t0 = Date.now();

// the suite (also read by bench/bench_grammar.c)
const SCHEMAS = JSON.parse(fs.readFileSync(path.join(root, 'tests/server/structured_schemas.json'), 'utf8'));

const tokenize = async s => (await post(base, '/tokenize', { prompt: s })).json.tokens;
const id1 = async s => { const t = await tokenize(s); if (t.length !== 1) throw new Error(`${s}: ${t}`); return t[0]; };
const [QUOTE, RBRACE, RBRACKET, NS, THINK_END] = await Promise.all(['"', '}', ']', ']<]minimax[>[', '</mm:think>'].map(id1));
const CLOSE = { [QUOTE]: 12, [RBRACE]: 12, [RBRACKET]: 12, [NS]: 12 };
const THINK = { ...CLOSE, [THINK_END]: 11 };
const msgs = [{ role: 'user', content: 'Answer in JSON.' }];
const off = { chat_template_kwargs: { enable_thinking: false } };

// one chat request (stream or not): {content, reasoning, tool_calls, finish}
async function chat(body, streamed) {
  if (!streamed) {
    const r = await client.chat.completions.create({ model: 'tiny', ...body });
    const c = r.choices[0];
    return { content: c.message.content, reasoning: c.message.reasoning_content, tool_calls: c.message.tool_calls || [], finish: c.finish_reason, choices: r.choices };
  }
  const out = { content: '', reasoning: '', tool_calls: [], finish: null };
  for await (const ch of await client.chat.completions.create({ model: 'tiny', ...body, stream: true })) {
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta.content) out.content += c.delta.content;
    if (c.delta.reasoning_content) out.reasoning += c.delta.reasoning_content;
    for (const tc of c.delta.tool_calls || []) {
      if (!out.tool_calls[tc.index]) out.tool_calls[tc.index] = { id: tc.id, type: 'function', function: { name: tc.function.name, arguments: '' } };
      if (tc.function.arguments) out.tool_calls[tc.index].function.arguments += tc.function.arguments;
    }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

function checkJson(text, schema) {
  let v;
  try { v = JSON.parse(text); } catch { return `does not parse: ${JSON.stringify(text).slice(0, 200)}`; }
  const validate = ajv.compile(schema);
  return validate(v) ? null : `fails the schema: ${JSON.stringify(text).slice(0, 200)} ${ajv.errorsText(validate.errors)}`;
}

try {
  // ---- response_format json_schema: 24 schemas x stream / non-stream x thinking on / off
  const jobs = [];
  SCHEMAS.forEach((schema, i) => {
    for (const streamed of [false, true])
      for (const think of [false, true])
        jobs.push((async () => {
          const body = { messages: msgs, max_tokens: 400, temperature: 1, seed: 100 + i, logit_bias: think ? THINK : CLOSE,
                         response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } }, ...(think ? {} : off) };
          const r = await chat(body, streamed);
          const bad = r.finish !== 'stop' ? `finish_reason ${r.finish} (${JSON.stringify(r.content).slice(0, 120)})` : checkJson(r.content, schema);
          return { i, streamed, think, bad, reasoning: r.reasoning };
        })());
  });
  const res = await Promise.all(jobs);
  const failed = res.filter(r => r.bad);
  for (const f of failed.slice(0, 8)) console.log(`  schema ${f.i} ${f.streamed ? 'stream' : 'non-stream'} thinking ${f.think ? 'on' : 'off'}: ${f.bad}`);
  ok(!failed.length, `json_schema: ${res.length - failed.length}/${res.length} outputs parse and validate (${SCHEMAS.length} schemas, stream and non-stream, thinking on and off)`);
  const thought = res.filter(r => r.think && r.reasoning).length;
  ok(thought > 0, `thinking on: free reasoning before the constrained answer (${thought} of ${res.length / 2} reasoned)`);

  // thinking on without a bias on </mm:think>: the reasoning runs free (here to max_tokens), no constrained content yet
  const free = await chat({ messages: msgs, max_tokens: 24, temperature: 1, seed: 3, response_format: { type: 'json_object' } }, false);
  ok(free.finish === 'length' && free.reasoning.length > 0 && !free.content, 'thinking on: the text before </mm:think> is unconstrained reasoning');

  // ---- json_object, guided_json, structured_outputs, completions, n = 2
  for (const streamed of [false, true]) {
    const r = await chat({ messages: msgs, max_tokens: 300, seed: 5, logit_bias: CLOSE, response_format: { type: 'json_object' }, ...off }, streamed);
    let v = null;
    try { v = JSON.parse(r.content); } catch {}
    ok(r.finish === 'stop' && v && typeof v === 'object' && !Array.isArray(v), `json_object ${streamed ? 'stream' : 'non-stream'}: a JSON object (${JSON.stringify(r.content).slice(0, 60)})`);
  }
  const S0 = SCHEMAS[0];
  const g1 = await chat({ messages: msgs, max_tokens: 300, seed: 6, logit_bias: CLOSE, guided_json: S0, ...off }, false);
  const g2 = await chat({ messages: msgs, max_tokens: 300, seed: 6, logit_bias: CLOSE, guided_json: JSON.stringify(S0), ...off }, false);
  ok(!checkJson(g1.content, S0) && g1.content === g2.content, "vLLM's guided_json (an object, or the same schema as a string)");
  const g3 = await chat({ messages: msgs, max_tokens: 300, seed: 6, logit_bias: CLOSE, structured_outputs: { json: S0 }, ...off }, false);
  ok(!checkJson(g3.content, S0) && g3.content === g1.content, "vLLM's structured_outputs {json}");
  const g4 = await chat({ messages: msgs, max_tokens: 300, seed: 6, logit_bias: CLOSE, structured_outputs: { json_object: true }, ...off }, false);
  ok(!checkJson(g4.content, { type: 'object' }), "vLLM's structured_outputs {json_object: true}");
  const cp = await client.completions.create({ model: 'tiny', prompt: 'JSON:', max_tokens: 300, seed: 7, logit_bias: CLOSE, response_format: { type: 'json_schema', json_schema: { name: 'p', schema: SCHEMAS[8] } } });
  ok(cp.choices[0].finish_reason === 'stop' && !checkJson(cp.choices[0].text, SCHEMAS[8]), 'completions with response_format json_schema');
  const two = await chat({ messages: msgs, max_tokens: 300, seed: 8, n: 2, logit_bias: CLOSE, response_format: { type: 'json_schema', json_schema: { name: 'n2', schema: SCHEMAS[2] } }, ...off }, false);
  ok(two.choices.length === 2 && two.choices.every(c => !checkJson(c.message.content, SCHEMAS[2])), 'n = 2: both choices validate');

  // ---- vLLM's guided_regex / guided_choice and structured_outputs {regex, choice}; "pattern" in schemas
  const RX = ['[A-Z]{2}-\\d{3}', '(yes|no)!?', '\\w{2,6}@[a-z]{2,5}\\.(com|org)', '[😀€é]{1,3}', '"[^"\\\\\\n]{0,6}"', '^(\\+|-)?\\d{1,4}(\\.\\d{1,2})?$'];
  const CHOICES = ['positive', 'negative', 'neutral', 'mixed 😀'];
  const rjobs = [];
  RX.forEach((re, i) => {
    const full = new RegExp('^(?:' + re + ')$', 'u');
    for (const streamed of [false, true])
      for (const think of [false, true])
        rjobs.push(chat({ messages: msgs, max_tokens: 200, temperature: 1, seed: 200 + i, guided_regex: re, ...(think ? { logit_bias: THINK } : off) }, streamed)
          .then(r => ({ what: `guided_regex ${JSON.stringify(re)} ${streamed ? 'stream' : 'non-stream'} thinking ${think ? 'on' : 'off'}`,
                        bad: r.finish !== 'stop' ? `finish_reason ${r.finish} (${JSON.stringify(r.content)})` : full.test(r.content) ? null : `${JSON.stringify(r.content)} does not match` })));
  });
  for (const streamed of [false, true])
    for (const think of [false, true])
      for (let k = 0; k < 3; k++)
        rjobs.push(chat({ messages: msgs, max_tokens: 200, temperature: 1, seed: 220 + k, guided_choice: CHOICES, ...(think ? { logit_bias: THINK } : off) }, streamed)
          .then(r => ({ what: `guided_choice ${streamed ? 'stream' : 'non-stream'} thinking ${think ? 'on' : 'off'}`,
                        bad: r.finish === 'stop' && CHOICES.includes(r.content) ? null : `finish_reason ${r.finish}, ${JSON.stringify(r.content)}` })));
  const rres = await Promise.all(rjobs), rbad = rres.filter(r => r.bad);
  for (const b of rbad.slice(0, 8)) console.log(`  ${b.what}: ${b.bad}`);
  ok(!rbad.length, `guided_regex (${RX.length} patterns) and guided_choice, stream and non-stream, thinking on and off: ${rres.length - rbad.length}/${rres.length} outputs match`);
  const r1 = await chat({ messages: msgs, max_tokens: 100, seed: 230, guided_regex: RX[2], ...off }, false);
  const r2 = await chat({ messages: msgs, max_tokens: 100, seed: 230, structured_outputs: { regex: RX[2] }, ...off }, false);
  const c1 = await chat({ messages: msgs, max_tokens: 100, seed: 231, guided_choice: CHOICES, ...off }, false);
  const c2 = await chat({ messages: msgs, max_tokens: 100, seed: 231, structured_outputs: { choice: CHOICES }, guided_decoding_backend: 'xgrammar', ...off }, false);
  ok(r1.content === r2.content && c1.content === c2.content && CHOICES.includes(c1.content),
     `structured_outputs {regex} / {choice} = guided_regex / guided_choice (${JSON.stringify(r1.content)}, ${JSON.stringify(c1.content)}); guided_decoding_backend accepted`);
  const cc = await client.completions.create({ model: 'tiny', prompt: 'Sentiment:', max_tokens: 50, seed: 232, n: 2, guided_choice: CHOICES });
  ok(cc.choices.every(c => c.finish_reason === 'stop' && CHOICES.includes(c.text)), `completions with guided_choice, n = 2: ${cc.choices.map(c => JSON.stringify(c.text)).join(' ')}`);
  const PAT = { type: 'object', properties: { code: { type: 'string', pattern: '^[A-Z]{3}\\d{2}$' }, note: { type: 'string', pattern: 'ok', maxLength: 6 },
                                              word: { type: 'string', pattern: '^(?:caf\u00e9|na\u00efve|"q")$' } }, required: ['code', 'note', 'word'] };
  const pjobs = [0, 1, 2, 3].map(k => chat({ messages: msgs, max_tokens: 300, seed: 240 + k, logit_bias: CLOSE, response_format: { type: 'json_schema', json_schema: { name: 'pat', schema: PAT } }, ...off }, k % 2 === 1));
  const pres = await Promise.all(pjobs), pbad = pres.map(r => r.finish !== 'stop' ? `finish_reason ${r.finish}` : checkJson(r.content, PAT)).filter(Boolean);
  for (const b of pbad) console.log('  ' + b);
  ok(!pbad.length, `json_schema with "pattern" (anchored, unanchored with maxLength, non-ASCII and a quote): ${pres.map(r => JSON.stringify(r.content)).join(' ')}`);
  // vLLM's guided_grammar (GBNF; the example of vLLM's documentation) and llama.cpp's grammar (recursive)
  const SQL = 'root ::= select_statement\nselect_statement ::= "SELECT " column " from " table " where " condition\n' +
              'column ::= "col_1 " | "col_2 "\ntable ::= "table_1 " | "table_2 "\ncondition ::= column "= " number\nnumber ::= "1 " | "2 "';
  const [LPAREN, RPAREN] = await Promise.all(['(', ')'].map(id1));
  const sqlRe = /^SELECT (col_1 |col_2 ) from (table_1 |table_2 ) where (col_1 |col_2 )= (1 |2 )$/;
  const BR = 'root ::= ws item ws\nitem ::= "(" ws (item (ws "," ws item){0,2})? ws ")" | [a-z]{1,3}\nws ::= [ ]?';
  const brOk = v => { const t = v.replace(/ /g, ''); let d = 0; for (const c of t) { d += c === '(' ? 1 : c === ')' ? -1 : 0; if (d < 0) return false; } return d === 0 && /^[a-z(),]+$/.test(t); };
  const gres = await Promise.all([0, 1, 2, 3].map(k => chat({ messages: msgs, max_tokens: 200, seed: 270 + k, ...(k < 2 ? { guided_grammar: SQL } : { grammar: BR }),
                                                             ...(k % 2 ? {} : off), logit_bias: { ...(k % 2 ? THINK : {}), ...(k < 2 ? {} : { [LPAREN]: 9, [RPAREN]: 12 }) } }, k === 1)));
  const gbad = gres.map((r, k) => r.finish !== 'stop' ? `finish ${r.finish} ${JSON.stringify(r.content)}` : (k < 2 ? sqlRe.test(r.content) : brOk(r.content)) ? null : JSON.stringify(r.content)).filter(Boolean);
  for (const b of gbad) console.log('  ' + b);
  ok(!gbad.length, `guided_grammar (vLLM's SQL example) and grammar (llama.cpp's name; recursive), thinking on and off: ${gres.map(r => JSON.stringify(r.content)).join(' ')}`);
  const gso = await chat({ messages: msgs, max_tokens: 100, seed: 270, structured_outputs: { grammar: SQL }, ...off }, false);
  ok(gso.content === gres[0].content, "structured_outputs {grammar} = guided_grammar");

  // "format" (what pydantic writes for datetime, date, UUID, EmailStr, IPv4Address fields)
  const FMT = { type: 'object', properties: { when: { type: 'string', format: 'date-time' }, day: { type: 'string', format: 'date' }, id: { type: 'string', format: 'uuid' },
                                              mail: { type: 'string', format: 'email' }, ip: { type: 'string', format: 'ipv4' }, opt: { anyOf: [{ type: 'string', format: 'date' }, { type: 'null' }] } },
                required: ['when', 'day', 'id', 'mail', 'ip', 'opt'] };
  const fmtOk = v => !isNaN(Date.parse(v.when)) && /^\d{4}-\d{2}-\d{2}T/.test(v.when) && !isNaN(Date.parse(v.day)) && /^[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$/i.test(v.id) &&
                     /^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$/.test(v.mail) && net.isIPv4(v.ip) && (v.opt === null || !isNaN(Date.parse(v.opt)));
  const fres = await Promise.all([0, 1, 2].map(k => chat({ messages: msgs, max_tokens: 400, seed: 260 + k, logit_bias: CLOSE, response_format: { type: 'json_schema', json_schema: { name: 'fmt', schema: FMT } }, ...off }, k === 1)));
  const fbad = fres.map(r => { let v = null; try { v = JSON.parse(r.content); } catch {} return r.finish === 'stop' && v && !checkJson(r.content, FMT) && fmtOk(v) ? null : `${r.finish} ${JSON.stringify(r.content)}`; }).filter(Boolean);
  for (const b of fbad) console.log('  ' + b);
  ok(!fbad.length, `json_schema with "format" date-time / date / uuid / email / ipv4: ${fres.map(r => r.content.replace(/\s+/g, '')).join(' ')}`);
  const PTOOL = [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: { sku: { type: 'string', pattern: '^[a-z]{2}[0-9]{3}$' }, qty: { type: 'integer', minimum: 1, maximum: 9 } }, required: ['sku', 'qty'] } } }];
  const pval = ajv.compile(PTOOL[0].function.parameters);
  const tcs = await Promise.all([0, 1, 2].map(k => chat({ messages: msgs, tools: PTOOL, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 200, seed: 250 + k, logit_bias: CLOSE, ...off }, k === 1)));
  ok(tcs.every(r => r.finish === 'tool_calls' && r.tool_calls.length === 1 && pval(JSON.parse(r.tool_calls[0].function.arguments))),
     `forced tool call with a "pattern" argument: ${tcs.map(r => r.tool_calls[0]?.function.arguments).join(' ')}`);

  // ---- forced tool calls
  const TOOLS = [
    { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', minLength: 1, maxLength: 16 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] }, days: { type: 'integer', minimum: 1, maximum: 14 } }, required: ['city', 'days'] } } },
    { type: 'function', function: { name: 'book_table', parameters: { type: 'object', properties: { guests: { type: 'array', items: { type: 'object', properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer', minimum: 0, maximum: 99 } }, required: ['name'] }, minItems: 1, maxItems: 3 }, vip: { type: 'boolean' }, note: { anyOf: [{ type: 'string', maxLength: 10 }, { type: 'null' }] } }, required: ['guests', 'vip'] } } },
    { type: 'function', function: { name: 'ping', parameters: { type: 'object', properties: {} } } },
  ];
  const validators = Object.fromEntries(TOOLS.map(t => [t.function.name, ajv.compile(t.function.parameters)]));
  const checkCalls = (r, allowed, min, max) => {
    if (r.finish !== 'tool_calls') return `finish_reason ${r.finish}`;
    if (r.tool_calls.length < min || r.tool_calls.length > max) return `${r.tool_calls.length} calls`;
    if (r.content) return `content beside the calls: ${JSON.stringify(r.content)}`;
    for (const c of r.tool_calls) {
      if (!allowed.includes(c.function.name)) return `a call of ${c.function.name}`;
      let a;
      try { a = JSON.parse(c.function.arguments); } catch { return `arguments do not parse: ${c.function.arguments}`; }
      if (!validators[c.function.name](a)) return `${c.function.name} arguments ${c.function.arguments}: ${ajv.errorsText(validators[c.function.name].errors)}`;
    }
    return null;
  };
  const all = TOOLS.map(t => t.function.name);
  const tjobs = [];
  for (const [what, tc, allowed, ptc] of [['required', 'required', all, true], ['required, parallel_tool_calls false', 'required', all, false],
                                         ['named get_weather', { type: 'function', function: { name: 'get_weather' } }, ['get_weather'], true],
                                         ['named book_table, parallel_tool_calls false', { type: 'function', function: { name: 'book_table' } }, ['book_table'], false]])
    for (const streamed of [false, true])
      for (const think of [false, true])
        for (let k = 0; k < 2; k++)
          tjobs.push((async () => {
            const r = await chat({ messages: msgs, tools: TOOLS, tool_choice: tc, parallel_tool_calls: ptc, max_tokens: 500, seed: 40 + k, logit_bias: think ? THINK : CLOSE, ...(think ? {} : off) }, streamed);
            return { what, streamed, think, bad: checkCalls(r, allowed, 1, ptc ? 64 : 1), n: r.tool_calls.length };
          })());
  const tres = await Promise.all(tjobs);
  for (const what of new Set(tres.map(r => r.what))) {
    const mine = tres.filter(r => r.what === what), bad = mine.filter(r => r.bad);
    for (const b of bad.slice(0, 4)) console.log(`  ${what} ${b.streamed ? 'stream' : 'non-stream'} thinking ${b.think ? 'on' : 'off'}: ${b.bad}`);
    ok(!bad.length, `tool_choice ${what}: ${mine.length - bad.length}/${mine.length} valid (calls: ${mine.map(r => r.n).join(' ')})`);
  }
  // strict tools (function.strict), tool_choice auto / absent: free text, then valid calls or none
  // text may come first; every completed call validates (at length the last call may be cut)
  const checkAuto = (r, max) => {
    const calls = r.finish === 'length' ? r.tool_calls.slice(0, -1) : r.tool_calls;
    if (r.tool_calls.length > max) return `${r.tool_calls.length} calls (at most ${max})`;
    if (r.tool_calls.length && !['tool_calls', 'length'].includes(r.finish)) return `finish_reason ${r.finish} after calls`;
    return checkCalls({ ...r, tool_calls: calls, content: '', finish: 'tool_calls' }, all, 0, max);
  };
  const STRICT = TOOLS.map(t => ({ ...t, function: { ...t.function, strict: true } }));
  const OPEN = (await tokenize(']<]minimax[>[<tool_call>'))[1]; // the opener's second token: biased with NS, calls begin
  const sjobs = [];
  for (let k = 0; k < 8; k++)
    sjobs.push(chat({ messages: msgs, tools: STRICT, ...(k % 2 ? { tool_choice: 'auto' } : {}), parallel_tool_calls: k < 4, max_tokens: 300, seed: 300 + k,
                      logit_bias: { ...CLOSE, [NS]: 13, [OPEN]: 13 }, ...(k % 4 === 3 ? { logit_bias: { ...THINK, [NS]: 13, [OPEN]: 13 } } : off) }, k % 3 === 1)
      .then(r => ({ k, r, bad: checkAuto(r, k < 4 ? 64 : 1) })));
  const sres2 = await Promise.all(sjobs), sbad2 = sres2.filter(x => x.bad);
  for (const b of sbad2) console.log(`  strict auto seed ${300 + b.k}: ${b.bad}`);
  const ncalls = sres2.reduce((a, x) => a + x.r.tool_calls.length, 0);
  ok(!sbad2.length && ncalls > 0, `strict tools, tool_choice auto: every call valid (${sres2.map(x => x.r.tool_calls.length).join(' ')} calls; finish ${sres2.map(x => x.r.finish).join(' ')})`);
  const M0 = (await metrics(base)).m3_structured_requests_total;
  await chat({ messages: msgs, tools: STRICT, tool_choice: 'none', max_tokens: 4, ...off }, false);
  await chat({ messages: msgs, tools: TOOLS, max_tokens: 4, ...off }, false);
  ok((await metrics(base)).m3_structured_requests_total === M0, 'no grammar for strict tools under tool_choice none, nor for tools without strict');

  // parallel_tool_calls false with tool_choice auto: free output, at most one call
  const auto = await Promise.all([0, 1, 2, 3].map(k => chat({ messages: msgs, tools: TOOLS, parallel_tool_calls: false, max_tokens: 40, seed: k, logit_bias: { [NS]: 6 }, ...off }, k % 2 === 1)));
  ok(auto.every(r => r.tool_calls.length <= 1), `parallel_tool_calls false, tool_choice auto: at most one call (${auto.map(r => r.tool_calls.length).join(' ')})`);

  // ---- streamed tool calls: the name first, then the arguments in pieces (get_weather: >= 2 arguments)
  const named = { messages: msgs, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_weather' } }, parallel_tool_calls: false, max_tokens: 300, logit_bias: CLOSE, ...off };
  const streamedCall = async seed => {
    const deltas = [];
    let finish = null, id = null;
    for await (const ch of await client.chat.completions.create({ model: 'tiny', ...named, seed, stream: true })) {
      id = id || ch.id;
      const c = ch.choices[0];
      if (!c) continue;
      for (const tc of c.delta.tool_calls || []) deltas.push(tc);
      if (c.finish_reason) finish = c.finish_reason;
    }
    return { deltas, finish, id };
  };
  const sres = await Promise.all([0, 1, 2].map(async k => ({ s: await streamedCall(70 + k), n: await chat({ ...named, seed: 70 + k }, false) })));
  const sbad = [];
  for (const [k, { s: st, n: ns }] of sres.entries()) {
    const d = st.deltas, first = d[0] || {}, rest = d.slice(1), args = d.map(x => x.function?.arguments || '').join('');
    const pieces = d.filter(x => x.function?.arguments).length;
    let a = null;
    try { a = JSON.parse(args); } catch {}
    const why = !d.length ? 'no tool_calls deltas'
      : !(first.index === 0 && /^call_/.test(first.id) && first.type === 'function' && first.function?.name === 'get_weather') ? `first delta ${JSON.stringify(first)}`
      : (first.function.arguments || '') === args ? `the first delta holds all the arguments ${JSON.stringify(args)}`
      : rest.some(x => x.index !== 0 || x.id || x.function?.name) ? 'a later delta repeats the id or the name, or another index'
      : pieces < 2 ? `arguments in ${pieces} delta(s)`
      : !a || !validators.get_weather(a) || Object.keys(a).length < 2 ? `arguments ${args} do not validate with >= 2 arguments`
      : st.finish !== 'tool_calls' ? `finish_reason ${st.finish}`
      : ns.tool_calls.length !== 1 || ns.tool_calls[0].function.arguments !== args ? `non-stream arguments ${ns.tool_calls[0]?.function.arguments} differ from the streamed ${args}`
      : null;
    if (why) sbad.push(`seed ${70 + k}: ${why}`);
  }
  for (const b of sbad) console.log('  ' + b);
  ok(!sbad.length, `streamed tool calls: name first, then the arguments in ${sres.map(r => r.s.deltas.filter(x => x.function?.arguments).length).join(', ')} deltas; they equal the non-stream arguments and validate`);

  // ---- a JSON answer is never read as a tool call, even when its strings spell the markup
  const trap = { type: 'array', prefixItems: [{ const: ']<]minimax[>[<tool_call>]<]minimax[>[<invoke name=' }, { const: 1 }, { const: '>]<]minimax[>[</invoke>]<]minimax[>[</tool_call>' }], items: false, minItems: 3 };
  for (const streamed of [false, true]) {
    const r = await chat({ messages: msgs, tools: TOOLS, max_tokens: 200, seed: 9, logit_bias: CLOSE, response_format: { type: 'json_schema', json_schema: { name: 'trap', schema: trap } }, ...off }, streamed);
    let v = null;
    try { v = JSON.parse(r.content); } catch {}
    ok(r.finish === 'stop' && !r.tool_calls.length && v && v[1] === 1 && v[0] === trap.prefixItems[0].const,
       `json_schema answer spelling the tool-call markup, tools given, ${streamed ? 'stream' : 'non-stream'}: content ${JSON.stringify(r.content).slice(0, 90)}, ${r.tool_calls.length} calls`);
  }

  // ---- a tool-call history sent back the OpenAI way (arguments a JSON string) renders as the model writes calls
  const hist = [...msgs, { role: 'assistant', content: '', tool_calls: [{ id: 'call_x', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris", "days": 3}' } }] }, { role: 'tool', tool_call_id: 'call_x', content: 'sunny' }];
  const ht = (await post(base, '/tokenize', { messages: hist, tools: TOOLS })).json;
  const hp = (await post(base, '/detokenize', { tokens: ht.tokens })).json.prompt;
  ok(hp.includes('<invoke name="get_weather">\n]<]minimax[>[<city>Paris]<]minimax[>[</city>\n]<]minimax[>[<days>3]<]minimax[>[</days>') && !hp.includes('{"city": "Paris"'),
     `tool-call history with string arguments renders as the model writes calls: ${JSON.stringify(hp.slice(hp.lastIndexOf('<invoke'), hp.lastIndexOf('</invoke>') + 9))}`);

  // ---- ids: random, different across requests and turns (and, below, across a restart)
  const turn1 = await client.chat.completions.create({ model: 'tiny', ...named, seed: 70 });
  const call1 = turn1.choices[0].message.tool_calls[0];
  const turn2 = await client.chat.completions.create({ model: 'tiny', ...named, seed: 71, messages: [...msgs, turn1.choices[0].message, { role: 'tool', tool_call_id: call1.id, content: 'sunny' }] });
  const call2 = turn2.choices[0].message.tool_calls?.[0];
  const idsBefore = [turn1.id, turn2.id, sres[0].s.id, call1.id, call2?.id, sres[0].s.deltas[0]?.id];
  ok(/^chatcmpl-[0-9a-f]{8,}$/.test(turn1.id) && /^call_[0-9a-f]{8,}/.test(call1.id) && call2 && new Set(idsBefore).size === idsBefore.length,
     `ids differ across requests and turns: ${idsBefore.join(' ')}`);

  // ---- unconstrained greedy requests beside constrained ones: the same tokens as alone
  const plain = [0, 1, 2, 3].map(k => ({ messages: [{ role: 'user', content: `plain ${k}` }], max_tokens: 24, temperature: 0, ...off }));
  const alone = [];
  for (const b of plain) alone.push((await chat(b, false)).content);
  const mixed = await Promise.all([...plain.map(b => chat(b, false)),
    ...SCHEMAS.slice(0, 8).map((schema, i) => chat({ messages: msgs, max_tokens: 200, seed: i, logit_bias: CLOSE, response_format: { type: 'json_schema', json_schema: { name: 'm', schema } }, ...off }, i % 2 === 0))]);
  ok(plain.every((_, k) => mixed[k].content === alone[k]), 'unconstrained greedy requests in a batch with constrained ones: the same text as alone');
  ok(mixed.slice(4).every((r, i) => !checkJson(r.content, SCHEMAS[i])), '... and the constrained ones of that batch validate');

  // masks: most computed ahead by the mask thread (while the forwards ran), the rest as rows were sampled
  const M = await metrics(base);
  const masks = M.m3_grammar_masks_total, ahead = M.m3_grammar_masks_ahead_total;
  ok(masks > 0 && ahead > 0 && ahead <= masks && M.m3_structured_requests_total > 0,
     `/metrics: ${M.m3_structured_requests_total} constrained sequences, ${masks} masks, ${ahead} computed ahead; waited ${(M.m3_grammar_mask_wait_seconds_total * 1e3).toFixed(1)} ms for them, ${(M.m3_grammar_mask_inline_seconds_total * 1e3).toFixed(1)} ms inline`);

  // ---- errors: 400 naming the problem, then a normal answer
  const err = async (body, param, want) => {
    const r = await post(base, '/v1/chat/completions', { messages: msgs, max_tokens: 8, ...body });
    ok(r.status === 400 && r.json?.error?.param === param && r.json.error.message.includes(want), `400 (${param}): ${r.json?.error?.message}`);
  };
  await err({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { d: { type: 'string', format: 'uri' } } } } } }, 'response_format', 'unsupported "format": "uri" (served, for strings: date-time, date, time, duration, email, hostname, ipv4, ipv6, uuid) at /properties/d/format');
  await err({ guided_json: { type: 'integer', minimum: 5, maximum: 1 } }, 'guided_json', 'no integer');
  // the request's words are never taken for the server's allocation failure (a 500): a property,
  // or a tool's argument, named "out of memory" beside what the compiler refuses
  await err({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { 'out of memory': { type: 'string', foo: 1 } } } } } }, 'response_format', 'unsupported keyword "foo" at /properties/out of memory');
  await err({ guided_json: { type: 'object', properties: { 'out of memory': { type: 'string', pattern: '(?<=x)' } } } }, 'guided_json', 'at /properties/out of memory/pattern');
  await err({ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { 'out of memory': { type: 'string' } }, required: ['out of memory'] } } }], tool_choice: 'required' }, 'tool_choice', 'the argument name "out of memory" cannot be written');
  await err({ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice', 'no function named "nope"');
  await err({ tools: TOOLS, tool_choice: 'required', response_format: { type: 'json_object' } }, 'tool_choice', 'cannot be combined');
  await err({ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'string', pattern: '(?=x)' } }, required: ['a'] } } }], tool_choice: 'required' }, 'tool_choice', 'tool "f"');
  await err({ structured_outputs: { structural_tag: '{}' } }, 'structured_outputs', 'not supported');
  await err({ guided_whitespace_pattern: ' ' }, 'guided_whitespace_pattern', 'not supported');
  await err({ guided_grammar: 'root ::= item\nitem ::= "a" | other' }, 'guided_grammar', 'grammar: the rule "other" is used but not defined (line 2, column 16)');
  await err({ grammar: 'root ::= root "x" | "y"' }, 'grammar', 'grammar: left-recursive rule');
  await err({ tools: [{ type: 'function', function: { name: 'f', strict: 'yes', parameters: { type: 'object' } } }] }, 'tools', "'tools[0].function.strict' must be a boolean");
  await err({ tools: [{ type: 'function', function: { name: 'f', strict: true, parameters: { type: 'object', properties: { a: { type: 'string', format: 'uri' } } } } }] }, 'tools', 'unsupported "format": "uri"');
  await err({ guided_regex: '(a)\\1' }, 'guided_regex', 'backreferences (\\1) are not supported (offset 3)');
  await err({ guided_regex: '[b-a]' }, 'guided_regex', 'range out of order');
  await err({ guided_regex: 5 }, 'guided_regex', 'must be a string');
  await err({ guided_choice: [] }, 'guided_choice', 'non-empty array of strings');
  await err({ guided_choice: ['a', 2] }, 'guided_choice', "'guided_choice[1]' must be a string");
  await err({ guided_choice: ['a'], guided_regex: 'a' }, 'guided_choice', "beside 'guided_regex'");
  await err({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '\\p{L}' } } } }, 'response_format', '"pattern": unicode property escapes');
  await err({ guided_regex: '(.{1000}|x.{999}|y.{998}|z.{997}|w.{996}|v.{995}|u.{994}|t.{993}|s.{992}|r.{991}|q.{990})' }, 'guided_regex', 'served grammars have at most 50000 automaton states: regex: too large (more than 50000 automaton states');
  { // the served limit's prefix by the error's kind: a refusal quoting the limit's own words gets none
    const r = await post(base, '/v1/chat/completions', { messages: msgs, max_tokens: 8,
      guided_json: { type: 'object', properties: { '(more than 50000 automaton states)': { type: 'string', foo: 1 } } } });
    const m = r.json?.error?.message || '';
    ok(r.status === 400 && m.includes('at /properties/(more than 50000 automaton states)/foo') && !m.includes('served grammars'),
       `a property named like the state limit: 400 without the limit's prefix: ${m}`);
  }
  const after = await chat({ messages: msgs, max_tokens: 4, ...off }, false);
  ok(after.finish === 'length', 'a normal request after the refusals');

  // ---- a restart: the same request (same seed) gives the same call under new ids
  const st1 = await srv.stop();
  ok(st1.code === 0, `server exits 0 on SIGTERM (${st1.code})`);
  const srv2 = await startServer(m3, ck, ['--served-model-name', 'tiny', '--grammar-threads', '1']);
  try {
    const c2 = new OpenAI({ baseURL: srv2.base + '/v1', apiKey: 'none' });
    const again = await c2.chat.completions.create({ model: 'tiny', ...named, seed: 70 });
    const callA = again.choices[0].message.tool_calls[0];
    ok(callA.function.arguments === call1.function.arguments && again.id !== turn1.id && callA.id !== call1.id && !idsBefore.includes(callA.id),
       `after a restart: the same call (${callA.function.arguments}) under new ids ${again.id} ${callA.id}`);
  } finally {
    await srv2.stop();
  }
  console.log(`(${((Date.now() - t0) / 1000).toFixed(1)} s)`);
} catch (e) {
  console.log('FAIL exception: ' + (e.stack || e));
  R.failed++;
} finally {
  const st = await srv.stop();
  ok(st.code === 0, `server exits 0 on SIGTERM (${st.code})`);
  if (R.failed) console.log(srv.log.split('\n').slice(-30).join('\n'));
}
console.log(R.failed ? `FAIL: ${R.failed} checks failed` : 'ok: all checks passed');
process.exit(R.failed ? 1 : 0);
