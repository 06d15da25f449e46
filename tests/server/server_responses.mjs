// OpenAI's Responses API (POST /v1/responses, GET / DELETE /v1/responses/{id}) through the official
// openai client, on a random-weight checkpoint:
//  - text: a greedy answer is the chat endpoint's for the same conversation (instructions = a system
//    message), reasoning -> a reasoning item equal to the chat reasoning, text -> a message item;
//    usage equal to the chat's prompt / completion tokens; reasoning.effort none: no reasoning item;
//  - streaming: named events (event: NAME, data.type NAME), sequence numbers 0, 1, 2, ...; the order
//    (created, in_progress, per item added / content_part.added / deltas / done / output_item.done,
//    completed or incomplete); the deltas add up to the non-stream items; the SDK's ResponseStream
//    accumulates the same response;
//  - max_output_tokens: status incomplete, incomplete_details max_output_tokens;
//  - tools: tool_choice required / a named function give function_call items whose arguments
//    validate (ajv) and whose call_id is unique, streamed in several argument deltas; a
//    function_call_output sent back renders the prompt the chat endpoint renders for the same
//    history (tokens and greedy answer equal); allowed_tools;
//  - text.format json_schema answers validate; json_object parses;
//  - logprobs (include message.output_text.logprobs): one entry per text token, tokens adding up to
//    the text, top_logprobs alternatives;
//  - stored responses: previous_response_id continues the conversation exactly as sending it whole
//    (instructions not carried); a chain of three; GET returns the response; DELETE, then 404 for it
//    and for the responses after it (naming the missing one); store false is not kept; a small
//    --responses-store evicts the oldest and says so; --responses-store 0: store false, and
//    previous_response_id refused;
//  - usage.input_tokens_details.cached_tokens: the prefix cache's hit for a repeated prompt;
//  - errors as the SDK's classes, naming the field: refused tools / items / parts, background, a
//    bad model, bad JSON; an engine failure mid-stream is a response.failed event, a 500 without;
//  - allocation failures injected into a running server: every answer equal to the clean server's
//    or a clean error (500, or a stream ending with response.failed), then the same answers again.
// Usage: node tests/server/server_responses.mjs <m3-binary> <work-dir>
import OpenAI from 'openai';
import Ajv from 'ajv/dist/2020.js';
import { makeCheckpoint, nanCheckpoint, startServer, post, reporter, metrics } from './lib.mjs';

const [m3, work] = process.argv.slice(2);
if (!m3 || !work) { console.error('usage: node server_responses.mjs <m3-binary> <work-dir>'); process.exit(2); }
const R = reporter(), ok = R.ok;
const ck = makeCheckpoint(m3, work + '/ck');
const KEY = 'sk-m3-responses-test';
const srv = await startServer(m3, ck, ['--served-model-name', 'tiny', '--api-key', KEY]);
const base = srv.base;
const client = new OpenAI({ baseURL: base + '/v1', apiKey: KEY, maxRetries: 0 });
const AUTH = { Authorization: `Bearer ${KEY}` };
const ajv = new Ajv({ strict: false, allErrors: true });
const t0 = Date.now();
const others = [];

const greedy = { model: 'tiny', temperature: 0 };
const OFF = { effort: 'none' };
const INSTR = 'You are terse. Answer in French.';

// the raw SSE of a streamed request: [{event, data}] plus anything malformed
async function rawStream(body, on = base, headers = AUTH) {
  const r = await fetch(on + '/v1/responses', { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify({ ...body, stream: true }) });
  const text = await r.text();
  const events = [], bad = [];
  if (r.status !== 200) return { status: r.status, events, bad, text };
  for (const ev of text.split('\n\n')) {
    if (!ev || ev.startsWith(':')) continue;
    const m = /^event: ([a-z_.]+)\ndata: (.*)$/s.exec(ev);
    if (!m) { bad.push(ev); continue; }
    try { events.push({ event: m[1], data: JSON.parse(m[2]) }); } catch { bad.push(ev); }
  }
  return { status: r.status, events, bad, text };
}

// Folds a stream's events into the items they describe, checking their order and numbering.
function fold(events) {
  const items = [];
  let err = null, open = -1, created = null, end = null;
  const e0 = events.map(e => e.data ?? e);
  e0.forEach((e, i) => {
    if (e.sequence_number !== i) err ??= `event ${i} (${e.type}) has sequence_number ${e.sequence_number}`;
    const it = items[e.output_index];
    switch (e.type) {
    case 'response.created': if (i !== 0) err ??= 'response.created not first'; created = e.response; break;
    case 'response.in_progress': if (i !== 1) err ??= 'response.in_progress not second'; break;
    case 'response.output_item.added':
      if (open >= 0) err ??= `item ${e.output_index} added while ${open} is open`;
      if (e.output_index !== items.length) err ??= `output_index ${e.output_index}, expected ${items.length}`;
      if (e.item.status && e.item.status !== 'in_progress') err ??= `an added item's status ${e.item.status}`;
      items.push({ item: structuredClone(e.item), text: '', args: '', deltas: 0, parts: 0, done: false });
      open = e.output_index;
      break;
    case 'response.content_part.added':
      if (!it || e.output_index !== open || e.content_index !== 0 || e.item_id !== it.item.id) err ??= `content_part.added for ${e.output_index}`;
      else it.parts++;
      break;
    case 'response.output_text.delta': case 'response.reasoning_text.delta':
      if (!it || e.output_index !== open || e.item_id !== it.item.id || !it.parts) { err ??= `${e.type} for ${e.output_index}`; break; }
      if ((e.type === 'response.output_text.delta') !== (it.item.type === 'message')) err ??= `${e.type} in a ${it.item.type} item`;
      it.text += e.delta; it.deltas++;
      if (e.logprobs) (it.lp ??= []).push(...e.logprobs);
      break;
    case 'response.function_call_arguments.delta':
      if (!it || e.output_index !== open || it.item.type !== 'function_call') { err ??= `arguments delta for ${e.output_index}`; break; }
      it.args += e.delta; it.deltas++;
      break;
    case 'response.output_text.done': case 'response.reasoning_text.done':
      if (!it || it.text !== e.text) err ??= `${e.type}: the text differs from its deltas`;
      break;
    case 'response.content_part.done':
      if (!it || it.text !== e.part.text) err ??= 'content_part.done: the text differs from the deltas';
      break;
    case 'response.function_call_arguments.done':
      if (!it || it.args !== e.arguments || it.item.name !== e.name) err ??= 'function_call_arguments.done differs from the deltas';
      break;
    case 'response.output_item.done':
      if (!it || e.output_index !== open) { err ??= `output_item.done for ${e.output_index} while ${open} is open`; break; }
      it.item = e.item; it.done = true; open = -1;
      break;
    case 'response.completed': case 'response.incomplete': case 'response.failed':
      if (i !== e0.length - 1) err ??= `${e.type} is not the last event`;
      if (open >= 0 && e.type !== 'response.failed') err ??= `${e.type} with item ${open} open`;
      end = e;
      break;
    default: err ??= `unexpected event ${e.type}`;
    }
  });
  if (!created) err ??= 'no response.created';
  if (!end) err ??= 'no final event';
  for (const it of items) {
    if (!it.done) continue;
    const t = it.item.type === 'message' ? it.item.content[0]?.text : it.item.type === 'reasoning' ? it.item.content?.[0]?.text : it.item.arguments;
    if ((it.item.type === 'function_call' ? it.args : it.text) !== t) err ??= `item ${it.item.id}: the deltas do not add up to the item`;
  }
  return { items, err, created, end, output: items.map(i => i.item) };
}

// items without their ids (they differ between responses) and the SDK's own additions (parsed, parsed_arguments)
const noIds = out => JSON.stringify(out, (k, v) => ['id', 'call_id', 'parsed', 'parsed_arguments'].includes(k) ? undefined : v);
const msgText = r => r.output.filter(i => i.type === 'message').map(i => i.content.map(c => c.text).join('')).join('');
const reasonText = r => r.output.filter(i => i.type === 'reasoning').map(i => i.content.map(c => c.text).join('')).join('');
const calls = r => r.output.filter(i => i.type === 'function_call');

// expects the promise to fail with the SDK's class cls and status, the message matching re, param as given
async function refused(p, cls, status, what, re, param) {
  try {
    await p;
    ok(false, `${what}: accepted`);
  } catch (e) {
    const good = e instanceof cls && e.status === status && (!re || re.test(e.error?.message ?? e.message)) &&
      (param === undefined || e.error?.param === param);
    ok(good, `${what}: ${e.constructor.name} ${e.status} (${e.error?.param}) ${e.error?.message ?? e.message}`);
    return e;
  }
}

try {
  // ---- text, non-stream, against the chat endpoint with the same conversation
  const plain = { ...greedy, max_output_tokens: 24, instructions: INSTR, input: 'Hello there', reasoning: OFF, metadata: { who: 'u1' } };
  const r1 = await client.responses.create(plain);
  ok(/^resp_[0-9a-f]{32}$/.test(r1.id) && r1.object === 'response' && r1.model === 'tiny' && r1.instructions === INSTR &&
     r1.metadata.who === 'u1' && r1.store === true && r1.max_output_tokens === 24 && r1.temperature === 0 && r1.tool_choice === 'auto',
     `a response: ${r1.id}, the request's fields repeated (instructions, metadata, store, max_output_tokens, temperature, tool_choice)`);
  ok(r1.output.length === 1 && r1.output[0].type === 'message' && r1.output[0].role === 'assistant' && /^msg_/.test(r1.output[0].id) &&
     r1.output[0].content.length === 1 && r1.output[0].content[0].type === 'output_text' && r1.output_text.length > 0,
     `effort none: one message item (${JSON.stringify(r1.output_text).slice(0, 60)})`);
  ok(r1.status === 'incomplete' && r1.incomplete_details?.reason === 'max_output_tokens' && r1.output[0].status === 'incomplete' &&
     r1.usage.output_tokens === 24 && r1.usage.output_tokens_details.reasoning_tokens === 0 &&
     r1.usage.total_tokens === r1.usage.input_tokens + 24,
     `max_output_tokens reached: status ${r1.status}, ${JSON.stringify(r1.incomplete_details)}, usage ${JSON.stringify(r1.usage)}`);
  const o1 = await client.chat.completions.create({ ...greedy, max_tokens: 24, chat_template_kwargs: { enable_thinking: false },
    messages: [{ role: 'system', content: INSTR }, { role: 'user', content: 'Hello there' }] });
  ok(o1.choices[0].message.content === r1.output_text && o1.usage.prompt_tokens === r1.usage.input_tokens &&
     o1.usage.completion_tokens === r1.usage.output_tokens, `the same text and usage as /v1/chat/completions (${o1.usage.prompt_tokens} prompt tokens)`);
  const ids = new Set();
  for (let i = 0; i < 3; i++) ids.add((await client.responses.create({ ...plain, max_output_tokens: 1 })).id);
  ok(ids.size === 3, 'response ids differ between requests');

  // ---- streaming
  const raw = await rawStream(plain);
  ok(raw.status === 200 && !raw.bad.length && raw.events.length > 6 && raw.events.every(e => e.event === e.data.type),
     `stream: every event is 'event: NAME' + 'data: {type: NAME}' (${raw.events.length} events, ${raw.bad.length} malformed)`);
  const f1 = fold(raw.events);
  ok(!f1.err && f1.end.type === 'response.incomplete' && f1.created.status === 'in_progress' && f1.created.output.length === 0,
     `stream: order and sequence numbers (${f1.err || raw.events.slice(0, 5).map(e => e.event).join(', ') + ', ... ' + f1.end.type})`);
  ok(noIds(f1.output) === noIds(r1.output) && noIds(f1.end.response.output) === noIds(r1.output) && f1.items[0].deltas > 1 &&
     f1.end.response.usage.input_tokens === r1.usage.input_tokens && f1.end.response.usage.output_tokens === 24 && f1.end.response.id === f1.created.id,
     `stream: ${f1.items[0]?.deltas} text deltas add up to the non-stream item; the final event's response has it and the same usage`);
  const s1 = client.responses.stream(plain);
  const seen = [];
  s1.on('response.output_text.delta', e => seen.push(e.snapshot));
  const fin1 = await s1.finalResponse();
  ok(noIds(fin1.output) === noIds(r1.output) && fin1.output_text === r1.output_text && seen.length > 1 && seen[seen.length - 1] === r1.output_text,
     `the SDK's ResponseStream accumulates the non-stream response (${seen.length} snapshots)`);

  // ---- reasoning on (the template's default) and off
  const think = { ...greedy, max_output_tokens: 20, input: 'Hello there' };
  const rOn = await client.responses.create({ ...think, reasoning: { effort: 'high', summary: 'auto' } });
  const rDef = await client.responses.create(think);
  const oOn = await client.chat.completions.create({ ...greedy, max_tokens: 20, messages: [{ role: 'user', content: 'Hello there' }] });
  ok(rOn.output[0]?.type === 'reasoning' && /^rs_/.test(rOn.output[0].id) && rOn.output[0].content[0].type === 'reasoning_text' &&
     Array.isArray(rOn.output[0].summary) && reasonText(rOn) === oOn.choices[0].message.reasoning_content && msgText(rOn) === (oOn.choices[0].message.content || ''),
     `reasoning: a reasoning item with the chat endpoint's reasoning (${JSON.stringify(reasonText(rOn)).slice(0, 40)}), the text its content`);
  // reasoning tokens: the generated tokens up to and with </mm:think> (the chat endpoint's logprobs list every token)
  // (a random model reasons on and on: a bias on </mm:think> ends some of it early)
  const thinkEnd = (await post(base, '/tokenize', { prompt: '</mm:think>' }, AUTH)).json.tokens;
  const rsn = async (max, input, bias) => {
    const logit_bias = bias ? { [thinkEnd[0]]: bias } : undefined;
    const r = await client.responses.create({ ...greedy, max_output_tokens: max, input, logit_bias });
    const o = await client.chat.completions.create({ ...greedy, max_tokens: max, messages: [{ role: 'user', content: input }], logprobs: true, logit_bias });
    const toks = o.choices[0].logprobs.content.map(x => x.token), end = toks.indexOf('</mm:think>');
    return [r.usage.output_tokens_details.reasoning_tokens, end >= 0 ? end + 1 : toks.length, r.usage.output_tokens, end];
  };
  const counts = await Promise.all([[20, 'Hello there', 0], [40, 'Hi', 2], [40, 'Why?', 3], [40, 'Name a color.', 4]].map(([m, i, b]) => rsn(m, i, b)));
  ok(thinkEnd.length === 1 && counts.every(([got, want]) => got === want) && counts.some(([, , out, end]) => end >= 0 && end + 1 < out),
     `reasoning_tokens = the tokens through </mm:think>: ${counts.map(([g, w, o]) => `${g}/${w} of ${o}`).join(', ')}`);
  ok(noIds(rDef.output) === noIds(rOn.output), 'reasoning absent: the template\'s default (enabled)');
  const fOn = fold((await rawStream({ ...think, reasoning: { effort: 'low' } })).events);
  ok(!fOn.err && noIds(fOn.output) === noIds(rOn.output) && fOn.items[0]?.deltas > 1,
     `reasoning stream: reasoning_text deltas add up to the same items${fOn.err ? ' (' + fOn.err + ')' : ''}`);
  const sOn = await client.responses.stream({ ...think, reasoning: { effort: 'low' } }).finalResponse();
  ok(noIds(sOn.output) === noIds(rOn.output), 'the SDK accumulates the reasoning item too');
  // the chat endpoint's reasoning_effort means the same
  const rOff = await client.responses.create({ ...think, reasoning: OFF });
  const cNone = await client.chat.completions.create({ ...greedy, max_tokens: 20, messages: [{ role: 'user', content: 'Hello there' }], reasoning_effort: 'none' });
  const cHigh = await client.chat.completions.create({ ...greedy, max_tokens: 20, messages: [{ role: 'user', content: 'Hello there' }], reasoning_effort: 'high' });
  ok(!cNone.choices[0].message.reasoning_content && cNone.choices[0].message.content === rOff.output_text && rOff.output.every(i => i.type !== 'reasoning') &&
     cHigh.choices[0].message.reasoning_content === oOn.choices[0].message.reasoning_content,
     "chat reasoning_effort 'none': no reasoning, the text of effort none here; 'high': the reasoning of thinking on");
  await refused(client.chat.completions.create({ ...greedy, max_tokens: 2, messages: [{ role: 'user', content: 'x' }], reasoning_effort: 'max' }),
                OpenAI.BadRequestError, 400, 'chat reasoning_effort max', /reasoning_effort/, 'reasoning_effort');

  // ---- tools
  const weather = { type: 'function', name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] }, unit: { enum: ['celsius', 'fahrenheit'] },
      days: { type: 'integer', enum: [1, 2, 3] } }, required: ['city', 'unit', 'days'], additionalProperties: false } };
  const clock = { type: 'function', name: 'get_time', description: 'The time in a zone',
    parameters: { type: 'object', properties: { zone: { enum: ['UTC', 'CET'] } }, required: ['zone'], additionalProperties: false } };
  const TOOLS = [weather, clock];
  const schemaOf = Object.fromEntries(TOOLS.map(t => [t.name, ajv.compile(t.parameters)]));
  const USERQ = [{ role: 'user', content: 'Weather in Paris?' }];
  const toolReq = { ...greedy, max_output_tokens: 400, input: USERQ, tools: TOOLS, reasoning: OFF };
  const checkCalls = (r, name, n, what) => {
    const cs = calls(r);
    const bad = cs.map(c => !/^call_/.test(c.call_id) || !/^fc_/.test(c.id) ? `ids ${c.id} ${c.call_id}` : name && c.name !== name ? `tool ${c.name}` :
      !schemaOf[c.name] ? `unknown tool ${c.name}` : (() => { try { return schemaOf[c.name](JSON.parse(c.arguments)) ? null : `arguments ${c.arguments}: ${ajv.errorsText(schemaOf[c.name].errors)}`; }
      catch { return `arguments do not parse: ${c.arguments}`; } })()).filter(Boolean);
    ok((n ? cs.length === n : cs.length >= 1) && !bad.length && new Set(cs.map(c => c.call_id)).size === cs.length && cs.every(c => c.status === 'completed' || c.status === 'incomplete'),
       `${what}: ${cs.length} function_call item(s) ${cs.map(c => c.name + c.arguments).join(' ')} ${bad.join('; ')}`);
    return cs;
  };
  const tReq = await client.responses.create({ ...toolReq, tool_choice: 'required', parallel_tool_calls: false });
  const [call] = checkCalls(tReq, null, 1, "tool_choice 'required', parallel_tool_calls false (one call)");
  const tNamed = await client.responses.create({ ...toolReq, tool_choice: { type: 'function', name: 'get_time' }, parallel_tool_calls: false });
  checkCalls(tNamed, 'get_time', 1, 'tool_choice {type: function, name: get_time}');
  const tAllowed = await client.responses.create({ ...toolReq, tool_choice: { type: 'allowed_tools', mode: 'required', tools: [{ type: 'function', name: 'get_time' }] }, parallel_tool_calls: false });
  checkCalls(tAllowed, 'get_time', 1, 'tool_choice allowed_tools [get_time], mode required');
  const oTools = TOOLS.map(({ type, name, description, parameters }) => ({ type, function: { name, description, parameters } }));
  const oReq = await client.chat.completions.create({ ...greedy, max_tokens: 400, messages: USERQ, tools: oTools, tool_choice: 'required',
    parallel_tool_calls: false, chat_template_kwargs: { enable_thinking: false } });
  const oc = oReq.choices[0].message.tool_calls;
  ok(oc?.length === 1 && oc[0].function.name === call.name && oc[0].function.arguments === call.arguments,
     'the call is the chat endpoint\'s for the same request');
  const fTool = fold((await rawStream({ ...toolReq, tool_choice: { type: 'function', name: 'get_weather' }, parallel_tool_calls: false })).events);
  const nTool = await client.responses.create({ ...toolReq, tool_choice: { type: 'function', name: 'get_weather' }, parallel_tool_calls: false });
  const sCall = fTool.items.find(i => i.item.type === 'function_call');
  ok(!fTool.err && sCall && sCall.deltas > 1 && noIds(fTool.output) === noIds(nTool.output) && fTool.end.type === 'response.completed',
     `tool stream: output_item.added function_call + ${sCall?.deltas} argument deltas = the non-stream items${fTool.err ? ' (' + fTool.err + ')' : ''}`);
  const sTool = await client.responses.stream({ ...toolReq, tool_choice: { type: 'function', name: 'get_weather' }, parallel_tool_calls: false }).finalResponse();
  ok(noIds(sTool.output) === noIds(nTool.output), 'the SDK accumulates the function_call item');
  const many = await client.responses.create({ ...toolReq, tool_choice: 'required' });
  checkCalls(many, null, 0, "tool_choice 'required', parallel calls allowed (every call valid, distinct call_ids)");
  // a round trip: the call and its output sent back, as the chat endpoint renders the same history
  const round = [...USERQ, { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
    { type: 'function_call_output', call_id: call.call_id, output: '{"temp": 21}' }];
  const rRound = await client.responses.create({ ...toolReq, max_output_tokens: 12, input: round });
  const oRound = await client.chat.completions.create({ ...greedy, max_tokens: 12, tools: oTools, chat_template_kwargs: { enable_thinking: false },
    messages: [...USERQ, { role: 'assistant', content: '', tool_calls: [{ id: call.call_id, type: 'function', function: { name: call.name, arguments: call.arguments } }] },
      { role: 'tool', tool_call_id: call.call_id, content: '{"temp": 21}' }] });
  ok(rRound.usage.input_tokens === oRound.usage.prompt_tokens && msgText(rRound) === (oRound.choices[0].message.content || '') &&
     calls(rRound).length === (oRound.choices[0].message.tool_calls?.length || 0),
     `function_call_output: the chat endpoint's prompt (${rRound.usage.input_tokens} tokens) and answer`);
  // an assistant's reasoning, text and calls in a row are one assistant message
  const hist = [{ role: 'user', content: 'Hi' }, { type: 'reasoning', id: 'rs_x', summary: [], content: [{ type: 'reasoning_text', text: 'They greet me.' }] },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Bonjour.', annotations: [] }] }, { role: 'user', content: 'Encore?' }];
  const rHist = await client.responses.create({ ...greedy, max_output_tokens: 4, input: hist, reasoning: OFF });
  const tk = (await post(base, '/tokenize', { messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Bonjour.', reasoning_content: 'They greet me.' },
    { role: 'user', content: 'Encore?' }], chat_template_kwargs: { enable_thinking: false } }, AUTH)).json;
  const prompt = (await post(base, '/detokenize', { tokens: tk.tokens }, AUTH)).json.prompt;
  ok(rHist.usage.input_tokens === tk.count && prompt.includes('<mm:think>They greet me.</mm:think>Bonjour.'),
     `input reasoning + message items: one assistant turn with its reasoning (${rHist.usage.input_tokens} = ${tk.count} tokens)`);

  // ---- structured outputs
  const OUT = { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome'] }, temp: { type: 'integer', minimum: -20, maximum: 45 } },
                required: ['city', 'temp'], additionalProperties: false };
  const outOk = ajv.compile(OUT);
  const jReq = { model: 'tiny', temperature: 1, max_output_tokens: 200, input: 'Weather?', reasoning: OFF };
  const parse = t => { try { return JSON.parse(t); } catch { return undefined; } };
  const js = await Promise.all([1, 2, 3].map(seed => client.responses.create({ ...jReq, seed, text: { format: { type: 'json_schema', name: 'w', schema: OUT, strict: true } } })));
  ok(js.every(r => outOk(parse(r.output_text)) && r.status === 'completed') && js[0].text.format.type === 'json_schema',
     `text.format json_schema: ${js.map(r => r.output_text.replace(/\s+/g, '')).join(' ')} validate`);
  const jsS = await client.responses.stream({ ...jReq, text: { format: { type: 'json_schema', name: 'w', schema: OUT } } }).finalResponse();
  ok(outOk(parse(jsS.output_text)), `text.format json_schema, streamed: ${jsS.output_text.replace(/\s+/g, '')}`);
  // (a random model writes long strings: logit_bias, a sampling field of the chat endpoint, favours closing them)
  const id1 = async t => (await post(base, '/tokenize', { prompt: t }, AUTH)).json.tokens[0];
  const CLOSE = Object.fromEntries((await Promise.all(['"', '}', ']'].map(id1))).map(i => [i, 12]));
  const jo = await client.responses.create({ ...jReq, seed: 5, max_output_tokens: 300, logit_bias: CLOSE, text: { format: { type: 'json_object' } } });
  ok(jo.status === 'completed' && typeof parse(jo.output_text) === 'object' && parse(jo.output_text) !== null && !Array.isArray(parse(jo.output_text)),
     `text.format json_object: a JSON object (${jo.output_text.replace(/\s+/g, '').slice(0, 60)})`);

  // ---- logprobs
  const lpReq = { ...plain, max_output_tokens: 8, include: ['message.output_text.logprobs'], top_logprobs: 3 };
  const rLp = await client.responses.create(lpReq);
  const lp = rLp.output[0].content[0].logprobs;
  ok(lp.length === 8 && lp.map(x => x.token).join('') === rLp.output_text && lp.every(x => x.logprob <= 0 && x.top_logprobs.length === 3 &&
     x.top_logprobs[0].logprob >= x.top_logprobs[2].logprob) && lp.every(x => x.top_logprobs[0].logprob === x.logprob),
     `logprobs: ${lp.length} entries whose tokens add up to the text, 3 alternatives each (greedy: the first is the token's own)`);
  // with reasoning first: the message's entries are its own tokens (not </mm:think>, not the reasoning's)
  const lpThink = { ...greedy, max_output_tokens: 40, input: 'Hi', include: ['message.output_text.logprobs'], top_logprobs: 1,
                    logit_bias: { [(await post(base, '/tokenize', { prompt: '</mm:think>' }, AUTH)).json.tokens[0]]: 3 } };
  const rLpT = await client.responses.create(lpThink);
  const sLpT = fold((await rawStream(lpThink)).events);
  const mLpT = rLpT.output.find(i => i.type === 'message');
  ok(rLpT.output[0].type === 'reasoning' && mLpT && mLpT.content[0].logprobs.map(x => x.token).join('') === mLpT.content[0].text &&
     mLpT.content[0].logprobs.length === rLpT.usage.output_tokens - rLpT.usage.output_tokens_details.reasoning_tokens &&
     JSON.stringify(sLpT.items.find(i => i.item.type === 'message')?.lp) === JSON.stringify(mLpT.content[0].logprobs),
     `logprobs after reasoning: ${mLpT?.content[0].logprobs.length} entries, the message's tokens alone (output ${rLpT.usage.output_tokens}, ` +
     `reasoning ${rLpT.usage.output_tokens_details.reasoning_tokens}); the stream's deltas carry the same`);
  const fLp = fold((await rawStream(lpReq)).events);
  ok(!fLp.err && JSON.stringify(fLp.items[0].lp) === JSON.stringify(lp) &&
     JSON.stringify(fLp.output[0].content[0].logprobs) === JSON.stringify(lp),
     'logprobs stream: the deltas carry the same entries');

  // ---- stored responses
  const a = await client.responses.create({ ...greedy, max_output_tokens: 6, instructions: INSTR, input: 'Name a color.', reasoning: OFF });
  const b = await client.responses.create({ ...greedy, max_output_tokens: 6, input: 'And another?', previous_response_id: a.id, reasoning: OFF });
  const bWhole = await client.responses.create({ ...greedy, max_output_tokens: 6, store: false, reasoning: OFF,
    input: [{ role: 'user', content: 'Name a color.' }, { role: 'assistant', content: a.output_text }, { role: 'user', content: 'And another?' }] });
  ok(b.previous_response_id === a.id && b.usage.input_tokens === bWhole.usage.input_tokens && b.output_text === bWhole.output_text,
     `previous_response_id: the prompt of the whole conversation, without the first instructions (${b.usage.input_tokens} tokens), the same answer`);
  const c = await client.responses.create({ ...greedy, max_output_tokens: 6, input: 'A third?', previous_response_id: b.id, instructions: INSTR, reasoning: OFF });
  const cWhole = await client.responses.create({ ...greedy, max_output_tokens: 6, store: false, instructions: INSTR, reasoning: OFF,
    input: [{ role: 'user', content: 'Name a color.' }, { role: 'assistant', content: a.output_text }, { role: 'user', content: 'And another?' },
      { role: 'assistant', content: b.output_text }, { role: 'user', content: 'A third?' }] });
  ok(c.usage.input_tokens === cWhole.usage.input_tokens && c.output_text === cWhole.output_text, 'a chain of three: the same as the whole conversation');
  // the repeated prompt's full pages come from the prefix cache (16-token pages on the CPU)
  const cached = cWhole.usage.input_tokens_details.cached_tokens;
  ok(cached > 0 && cached % 16 === 0 && cached <= cWhole.usage.input_tokens - 1 && cached > cWhole.usage.input_tokens - 17,
     `cached_tokens: ${cached} of ${cWhole.usage.input_tokens} prompt tokens from the prefix cache (the first request's: ${c.usage.input_tokens_details.cached_tokens})`);
  // a function call continued by its output, with previous_response_id
  const tc = await client.responses.create({ ...toolReq, tool_choice: { type: 'function', name: 'get_weather' }, parallel_tool_calls: false });
  const tcCall = calls(tc)[0];
  const tc2 = await client.responses.create({ ...toolReq, max_output_tokens: 12, previous_response_id: tc.id,
    input: [{ type: 'function_call_output', call_id: tcCall.call_id, output: '{"temp": 21}' }] });
  const tcWhole = await client.responses.create({ ...toolReq, max_output_tokens: 12, store: false,
    input: [...USERQ, { type: 'function_call', call_id: tcCall.call_id, name: tcCall.name, arguments: tcCall.arguments },
      { type: 'function_call_output', call_id: tcCall.call_id, output: '{"temp": 21}' }] });
  ok(tc2.usage.input_tokens === tcWhole.usage.input_tokens && noIds(tc2.output) === noIds(tcWhole.output),
     'previous_response_id after a function call + its output: as the whole conversation');
  // input items as the API lists them: ids, typed messages with parts; the SDK pages through them
  const li = await (await fetch(`${base}/v1/responses/${c.id}/input_items`, { headers: AUTH })).json();
  ok(li.object === 'list' && li.data.length === 1 && li.data[0].type === 'message' && li.data[0].role === 'user' && /^msg_[0-9a-f]+_in0$/.test(li.data[0].id) &&
     li.data[0].status === 'completed' && JSON.stringify(li.data[0].content) === JSON.stringify([{ type: 'input_text', text: 'A third?' }]) &&
     li.has_more === false && li.first_id === li.data[0].id && li.last_id === li.data[0].id,
     `GET /v1/responses/{id}/input_items: the string input as a user message (${JSON.stringify(li.data[0])})`);
  const rIn = await client.responses.create({ ...toolReq, max_output_tokens: 2, input: [...round, { type: 'message', role: 'user', content: 'thanks', id: 'msg_mine' }] });
  const walked = [];
  for await (const it of client.responses.inputItems.list(rIn.id, { order: 'asc', limit: 1 })) walked.push(it);
  const descPage = await client.responses.inputItems.list(rIn.id, { limit: 2 });
  ok(walked.map(i => i.type).join() === 'message,function_call,function_call_output,message' && walked[1].call_id === call.call_id &&
     walked[2].output === '{"temp": 21}' && walked[3].id === 'msg_mine' && new Set(walked.map(i => i.id)).size === 4 &&
     descPage.data.map(i => i.id).join() === [walked[3].id, walked[2].id].join() && descPage.has_more === true,
     `input_items paged by the SDK one at a time (asc, after=): ${walked.map(i => i.type + ':' + i.id.replace(/_[0-9a-f]{32}_/, '_*_')).join(' ')}; desc, limit 2: the last two, has_more`);
  const beforePage = await (await fetch(`${base}/v1/responses/${rIn.id}/input_items?order=asc&limit=2&before=${walked[3].id}`, { headers: AUTH })).json();
  ok(beforePage.data.map(i => i.id).join() === [walked[1].id, walked[2].id].join() && beforePage.has_more === true,
     'input_items before= (asc, limit 2): the two items next to the cursor, has_more (one more before them)');
  const badCursor = await fetch(`${base}/v1/responses/${rIn.id}/input_items?after=nope`, { headers: AUTH });
  const badLimit = await fetch(`${base}/v1/responses/${rIn.id}/input_items?limit=0`, { headers: AUTH });
  ok(badCursor.status === 400 && badLimit.status === 400 && /after/.test((await badCursor.json()).error.message), 'input_items: a cursor naming no item, limit 0: 400');
  const got = await client.responses.retrieve(b.id);
  ok(JSON.stringify(got) === JSON.stringify(b), 'GET /v1/responses/{id}: the response as it was answered');
  const notStored = await client.responses.create({ ...plain, max_output_tokens: 2, store: false });
  await refused(client.responses.retrieve(notStored.id), OpenAI.NotFoundError, 404, 'store false: not kept', /no stored response/);
  const del = await client.responses.delete(a.id);
  ok(del === undefined || del?.deleted === true || del === '' || typeof del === 'object', `DELETE /v1/responses/{id}: ${JSON.stringify(del)}`);
  const delRaw = await fetch(base + '/v1/responses/' + b.id, { method: 'DELETE', headers: AUTH });
  ok(delRaw.status === 200 && (await delRaw.json()).deleted === true, 'DELETE answers {id, object, deleted: true}');
  await refused(client.responses.retrieve(a.id), OpenAI.NotFoundError, 404, 'a deleted response: 404', /no stored response/);
  // OpenAI's error (400, code previous_response_not_found: clients resend the whole conversation on it)
  const e1 = await refused(client.responses.create({ ...greedy, input: 'x', previous_response_id: a.id }), OpenAI.BadRequestError, 400,
                'previous_response_id of a deleted response', new RegExp(`^Previous response with id '${a.id}' not found\\.`), 'previous_response_id');
  const e2 = await refused(client.responses.create({ ...greedy, input: 'x', previous_response_id: c.id }), OpenAI.BadRequestError, 400,
                'a chain whose earlier response was deleted names it', new RegExp(`goes back to response '${b.id}'`), 'previous_response_id');
  ok(e1?.code === 'previous_response_not_found' && e2?.code === 'previous_response_not_found', `error code ${e1?.code}`);
  const delAgain = await fetch(base + '/v1/responses/' + a.id, { method: 'DELETE', headers: AUTH });
  ok(delAgain.status === 404, 'DELETE of a response not stored: 404');
  const noAuth = await fetch(base + '/v1/responses/' + c.id);
  ok(noAuth.status === 401, 'GET without the key: 401');

  // a small store: the oldest responses make room, and a request continuing one says so
  const small = await startServer(m3, ck, ['--served-model-name', 'tiny', '--responses-store', '6000', '--enable-prompt-tokens-details']);
  others.push(small);
  const sc = new OpenAI({ baseURL: small.base + '/v1', apiKey: 'none', maxRetries: 0 });
  const firsts = [];
  for (let i = 0; i < 6; i++) firsts.push(await sc.responses.create({ ...greedy, max_output_tokens: 2, input: `Question ${i}?`, reasoning: OFF }));
  await refused(sc.responses.retrieve(firsts[0].id), OpenAI.NotFoundError, 404, 'a small --responses-store: the oldest is gone', /made room/);
  const last = await sc.responses.retrieve(firsts[5].id);
  ok(last.id === firsts[5].id, 'the newest is kept');
  await refused(sc.responses.create({ ...greedy, input: 'x', previous_response_id: firsts[0].id }), OpenAI.BadRequestError, 400,
                'previous_response_id of an evicted response', /made room/, 'previous_response_id');
  // (the order of eviction, least recently used first, is test_responses'); /metrics counts it
  const smm = await metrics(small.base);
  ok(smm['m3_responses_evicted_total'] >= 2 && smm['m3_responses_stored'] >= 1 && smm['m3_responses_store_capacity_bytes'] === 6000 &&
     smm['m3_responses_store_bytes'] <= 6000,
     `/metrics: ${smm['m3_responses_evicted_total']} evicted, ${smm['m3_responses_stored']} stored, ${smm['m3_responses_store_bytes']} of ` +
     `${smm['m3_responses_store_capacity_bytes']} bytes`);
  // (that server has vLLM's --enable-prompt-tokens-details: chat usage names the cached tokens too;
  // the main server's does not, as vLLM's default)
  const chatQ = { ...greedy, max_tokens: 2, messages: [{ role: 'user', content: 'Q'.repeat(40) + ' is a long question about caching?' }] };
  const ch1 = await sc.chat.completions.create(chatQ), ch2 = await sc.chat.completions.create(chatQ);
  const chMain = await client.chat.completions.create(chatQ);
  const st2 = [];
  for await (const ch of await sc.chat.completions.create({ ...chatQ, stream: true, stream_options: { include_usage: true } })) if (ch.usage) st2.push(ch.usage);
  ok(ch1.usage.prompt_tokens_details?.cached_tokens === 0 && ch2.usage.prompt_tokens_details?.cached_tokens > 0 &&
     ch2.usage.prompt_tokens_details.cached_tokens % 16 === 0 && st2[0]?.prompt_tokens_details?.cached_tokens === ch2.usage.prompt_tokens_details.cached_tokens &&
     chMain.usage.prompt_tokens_details === undefined,
     `--enable-prompt-tokens-details: chat usage cached_tokens ${ch1.usage.prompt_tokens_details?.cached_tokens}, then ${ch2.usage.prompt_tokens_details?.cached_tokens} of ` +
     `${ch2.usage.prompt_tokens} (stream usage too); without the flag no prompt_tokens_details`);
  // a conversation read back holds at most --max-body bytes: what it could hold sent whole
  const capped = await startServer(m3, ck, ['--served-model-name', 'tiny', '--max-body', '3000']);
  others.push(capped);
  const cc = new OpenAI({ baseURL: capped.base + '/v1', apiKey: 'none', maxRetries: 0 });
  let prevR = null;
  const words = 'lorem ipsum dolor sit amet '.repeat(40).slice(0, 1000);
  for (let i = 0; i < 3; i++)
    prevR = await cc.responses.create({ ...greedy, max_output_tokens: 2, input: words, reasoning: OFF, ...(prevR ? { previous_response_id: prevR.id } : {}) });
  await refused(cc.responses.create({ ...greedy, max_output_tokens: 2, input: words, previous_response_id: prevR.id }), OpenAI.BadRequestError, 400,
                'a conversation over --max-body', /more than --max-body \(3000 bytes\)/, 'previous_response_id');
  // truncation "auto": a conversation over the context loses its earliest messages, as few as fit
  const short = await startServer(m3, ck, ['--served-model-name', 'tiny', '--max-model-len', '200']);
  others.push(short);
  const shc = new OpenAI({ baseURL: short.base + '/v1', apiKey: 'none', maxRetries: 0 });
  const convo = [];
  for (let i = 0; i < 10; i++) convo.push({ role: i % 2 ? 'assistant' : 'user', content: `Message ${i}: ` + 'words and more words '.repeat(3) });
  const long = { ...greedy, max_output_tokens: 8, instructions: 'Be brief.', reasoning: OFF, input: convo };
  const ctxErr = await refused(shc.responses.create(long), OpenAI.BadRequestError, 400, 'over the context, truncation disabled',
                               /This model's maximum context length is 200 tokens\. However/, 'input');
  ok(ctxErr?.code === 'context_length_exceeded', `OpenAI's code for it: ${ctxErr?.code}`);
  const chatErr = await refused(shc.chat.completions.create({ ...greedy, max_tokens: 8, messages: convo }), OpenAI.BadRequestError, 400,
                                'the chat endpoint over the context: worded as OpenAI / vLLM word it', /^This model's maximum context length is 200 tokens\./);
  ok(chatErr?.code === 400, `... with vLLM's code there (the status): ${chatErr?.code}`);
  const tr = await shc.responses.create({ ...long, truncation: 'auto' });
  const toks = async k => (await post(short.base, '/tokenize', { messages: [{ role: 'system', content: 'Be brief.' }, ...convo.slice(k)],
    chat_template_kwargs: { enable_thinking: false } })).json.count;
  let kept = -1;
  for (let k = 1; k < convo.length && kept < 0; k++) if (await toks(k) === tr.usage.input_tokens) kept = k;
  const trChat = await shc.chat.completions.create({ ...greedy, max_tokens: 8, chat_template_kwargs: { enable_thinking: false },
    messages: [{ role: 'system', content: 'Be brief.' }, ...convo.slice(kept)] });
  ok(tr.truncation === 'auto' && kept > 0 && tr.usage.input_tokens + 8 <= 200 && await toks(kept - 1) + 8 > 200 &&
     tr.output_text === trChat.choices[0].message.content,
     `truncation auto: the first ${kept} messages dropped (${tr.usage.input_tokens} prompt tokens + 8 <= 200; one fewer dropped would not fit), ` +
     'the instructions kept, the answer of that conversation');
  // an agent loop (calls and their results): a cut never leaves a result without its call
  const loop = [{ role: 'user', content: 'Check the weather in every city, one call at a time.' }], loopChat = [loop[0]];
  for (let i = 0; i < 6; i++) {
    const args = JSON.stringify({ city: ['Paris', 'Rome', 'Oslo'][i % 3], unit: 'celsius', days: 1 });
    loop.push({ type: 'function_call', call_id: `c${i}`, name: 'get_weather', arguments: args },
              { type: 'function_call_output', call_id: `c${i}`, output: `{"temp": ${10 + i}, "sky": "clear and calm"}` });
    loopChat.push({ role: 'assistant', content: '', tool_calls: [{ id: `c${i}`, type: 'function', function: { name: 'get_weather', arguments: args } }] },
                  { role: 'tool', tool_call_id: `c${i}`, content: `{"temp": ${10 + i}, "sky": "clear and calm"}` });
  }
  const trLoop = await shc.responses.create({ ...greedy, max_output_tokens: 8, reasoning: OFF, truncation: 'auto', input: loop });
  const loopToks = async k => (await post(short.base, '/tokenize', { messages: loopChat.slice(k),
    chat_template_kwargs: { enable_thinking: false } })).json.count;
  let loopKept = -1;
  for (let k = 1; k < loopChat.length && loopKept < 0; k++) if (await loopToks(k) === trLoop.usage.input_tokens) loopKept = k;
  let prevCut = loopKept - 1;
  while (prevCut > 0 && loopChat[prevCut].role === 'tool') prevCut--;
  ok(loopKept > 0 && loopChat[loopKept].role === 'assistant' && trLoop.usage.input_tokens + 8 <= 200 && (await loopToks(prevCut)) + 8 > 200,
     `truncation auto in an agent loop: the first ${loopKept} messages dropped, the kept conversation starts with a call (${loopChat[loopKept]?.role}), ` +
     `${trLoop.usage.input_tokens} prompt tokens (the cut before, at ${prevCut}, would not fit)`);
  const tooLong = await refused(shc.responses.create({ ...long, truncation: 'auto', input: [{ role: 'user', content: 'w '.repeat(400) }] }),
                                OpenAI.BadRequestError, 400, 'truncation auto when the last message alone is over the context',
                                /^This model's maximum context length is 200 tokens\./, 'input');
  ok(tooLong?.code === 'context_length_exceeded', `... with OpenAI's code (${tooLong?.code})`);
  // --responses-store 0: nothing kept, and previous_response_id refused
  const none = await startServer(m3, ck, ['--served-model-name', 'tiny', '--responses-store', '0']);
  others.push(none);
  const nc = new OpenAI({ baseURL: none.base + '/v1', apiKey: 'none', maxRetries: 0 });
  const n1 = await nc.responses.create({ ...greedy, max_output_tokens: 2, input: 'Hi', reasoning: OFF });
  ok(n1.store === false, '--responses-store 0: the response says store false');
  await refused(nc.responses.create({ ...greedy, input: 'x', previous_response_id: n1.id }), OpenAI.BadRequestError, 400,
                '--responses-store 0: previous_response_id refused', /stores none/, 'previous_response_id');
  await refused(nc.responses.retrieve(n1.id), OpenAI.NotFoundError, 404, '--responses-store 0: GET 404', /stores none/);

  // ---- errors as the SDK's classes
  const B = OpenAI.BadRequestError;
  await refused(client.responses.create({ ...plain, tools: [{ type: 'web_search' }] }), B, 400, 'a web_search tool', /web_search/, 'tools[0]');
  await refused(client.responses.create({ ...plain, background: true }), B, 400, 'background', /background/, 'background');
  await refused(client.responses.create({ ...plain, input: [{ type: 'item_reference', id: 'x' }] }), B, 400, 'an item reference', /previous_response_id/, 'input[0]');
  await refused(client.responses.create({ ...plain, input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'f' }] }] }), B, 400,
                'an input_file part', /input_file/, 'input[0].content[0]');
  await refused(client.responses.create({ ...plain, input: [{ role: 'user', content: [{ type: 'input_image', file_id: 'f' }] }] }), B, 400,
                'an image by file_id', /Files API/, 'input[0].content[0]');
  await refused(client.responses.create({ ...plain, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://example.com/a.png' }] }] }), B, 400,
                'an image on a model without a vision tower');
  await refused(client.responses.create({ ...plain, include: ['file_search_call.results'] }), B, 400, 'an include entry', /file_search_call/, 'include');
  await refused(client.responses.create({ ...plain, text: { format: { type: 'json_schema', name: 'x' } } }), B, 400, 'json_schema without a schema', /schema/, 'text.format');
  await refused(client.responses.create({ ...plain, reasoning: { effort: 'max' } }), B, 400, 'a bad reasoning effort', /effort/, 'reasoning.effort');
  await refused(client.responses.create({ ...plain, tool_choice: { type: 'function', name: 'nope' }, tools: TOOLS }), B, 400, 'tool_choice naming no tool', /nope/);
  await refused(client.responses.create({ ...plain, temperature: 5 }), B, 400, 'temperature 5', /temperature/, 'temperature');
  await refused(client.responses.create({ ...plain, model: 'nope' }), OpenAI.NotFoundError, 404, 'an unknown model', /nope/, 'model');
  await refused(client.responses.create({ ...plain, input: [] }), B, 400, 'an empty input', /input/, 'input');
  // the chat endpoint's spellings are refused naming this API's fields, never ignored
  await refused(client.responses.create({ ...plain, max_tokens: 5 }), B, 400, 'max_tokens', /max_output_tokens/, 'max_tokens');
  await refused(client.responses.create({ ...plain, messages: [{ role: 'user', content: 'x' }] }), B, 400, 'messages', /'input'/, 'messages');
  await refused(client.responses.create({ ...plain, response_format: { type: 'json_object' } }), B, 400, 'response_format', /text\.format/, 'response_format');
  await refused(client.responses.create({ ...plain, n: 3 }), B, 400, 'n 3', /one output/, 'n');
  // the chat parser's findings, named as this API names them
  await refused(client.responses.create({ ...plain, max_output_tokens: 0 }), B, 400, 'max_output_tokens 0', /'max_output_tokens'/, 'max_output_tokens');
  await refused(client.responses.create({ ...plain, max_output_tokens: 1 << 29 }), B, 400, 'max_output_tokens over the context', /max_output_tokens/, 'max_output_tokens');
  await refused(client.responses.create({ ...plain, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:image/png;base64,AAAA' }] }] }), B, 400,
                'an image on a model without a vision tower, named in the input', /conversation as chat messages/, 'input');
  await refused(client.responses.create({ ...plain, tools: TOOLS, tool_choice: { type: 'allowed_tools', mode: 'auto', tools: Array(513).fill({ type: 'function', name: 'get_time' }) } }),
                B, 400, 'allowed_tools with 513 entries', /limit is 512/, 'tool_choice');
  await refused(client.responses.create({ ...plain, input: [{ type: 'function_call_output', call_id: 'c'.repeat(300), output: 'x' }] }), B, 400,
                'a call_id of 300 bytes', /longer than 256/, 'input[0]');
  await refused(new OpenAI({ baseURL: base + '/v1', apiKey: 'wrong', maxRetries: 0 }).responses.create(plain), OpenAI.AuthenticationError, 401, 'a wrong key');
  const badJson = await post(base, '/v1/responses', '{"model": ', AUTH);
  ok(badJson.status === 400 && badJson.json?.error?.type === 'invalid_request_error', `bad JSON: ${badJson.text.slice(0, 100)}`);
  const wrongMethod = await fetch(base + '/v1/responses/' + c.id, { method: 'POST', headers: AUTH });
  ok(wrongMethod.status === 405, 'POST /v1/responses/{id}: 405');
  const restream = await fetch(base + '/v1/responses/' + c.id + '?stream=true', { headers: AUTH });
  const upstream = await fetch(base + '/v1/responses/' + c.id + '?upstream=true', { headers: AUTH });
  ok(restream.status === 400 && /background/.test((await restream.json()).error.message) && upstream.status === 200,
     'GET ?stream=true: 400 (no background responses); another parameter (upstream=true) does not mean it');
  // DELETE while it is generated: it is not stored when it completes
  const gone = client.responses.stream({ ...greedy, max_output_tokens: 200, input: 'Tell me another story.', reasoning: OFF });
  let goneId = null, delLive = null, itemsLive = null;
  for await (const ev of gone) {
    if (ev.type === 'response.created') goneId = ev.response.id;
    if (ev.type === 'response.output_text.delta' && !delLive && goneId) {
      itemsLive = await fetch(`${base}/v1/responses/${goneId}/input_items`, { headers: AUTH });
      delLive = await fetch(base + '/v1/responses/' + goneId, { method: 'DELETE', headers: AUTH });
    }
  }
  ok(itemsLive?.status === 404 && /still being generated/.test((await itemsLive.json()).error.message) && delLive?.status === 200,
     'input_items while generated: 404 saying so; DELETE while generated: 200');
  await refused(client.responses.retrieve(goneId), OpenAI.NotFoundError, 404, 'deleted while generated: not stored', /no stored response/);
  const longId = 'resp_' + 'f'.repeat(200);
  await refused(client.responses.create({ ...greedy, input: 'x', previous_response_id: longId }), OpenAI.BadRequestError, 400,
                'a long previous_response_id: named as not found (not as a conversation going back to itself)', /^Previous response with id '[^']+' not found\. /,
                'previous_response_id');
  await refused(client.responses.create({ ...plain, text: { format: { type: 'json_schema', name: 'x', schema: { type: 'integer', multipleOf: 3 } } } }),
                OpenAI.BadRequestError, 400, 'an unsupported schema keyword, named in text.format', /multipleOf/, 'text.format');
  // a response still being generated: GET answers it as it stands (in_progress), then as stored
  const live = client.responses.stream({ ...greedy, max_output_tokens: 300, input: 'Tell me a long story.', reasoning: OFF });
  let liveId = null, during = null;
  for await (const ev of live) {
    if (ev.type === 'response.created') liveId = ev.response.id;
    if (ev.type === 'response.output_text.delta' && !during && liveId) during = await client.responses.retrieve(liveId);
  }
  const liveDone = await live.finalResponse();
  const stored = await client.responses.retrieve(liveId);
  ok(during?.status === 'in_progress' && during.id === liveId && during.usage === null && stored.status === liveDone.status &&
     noIds(stored.output) === noIds(liveDone.output) && stored.output_text === liveDone.output_text,
     `GET during generation: status ${during?.status} (${during?.output?.length} item(s) so far); after it: ${stored.status}, the streamed output`);

  // ---- an error mid-stream: a copy of the checkpoint with one token's embedding row NaN
  const bad = (await post(base, '/tokenize', { prompt: ' zebra' }, AUTH)).json.tokens[0];
  const nck = nanCheckpoint(ck, work + '/nan-ck', bad);
  const nanSrv = await startServer(m3, nck, ['--served-model-name', 'tiny']);
  others.push(nanSrv);
  const nan = new OpenAI({ baseURL: nanSrv.base + '/v1', apiKey: 'none', maxRetries: 0 });
  const zebra = { ...plain, input: 'A zebra' };
  await refused(nan.responses.create(zebra), OpenAI.InternalServerError, 500, 'the engine fails (non-stream): 500', /non-finite/);
  const mid = await rawStream(zebra, nanSrv.base, {});
  const fm = fold(mid.events);
  ok(mid.status === 200 && !mid.bad.length && fm.end?.type === 'response.failed' && fm.end.response.status === 'failed' &&
     /non-finite/.test(fm.end.response.error?.message) && !mid.events.some(e => e.event === 'response.completed'),
     `the engine fails mid-stream: ${mid.events.map(e => e.event).join(', ')} (${fm.end?.response?.error?.message})`);
  const stillOk = await nan.responses.create({ ...plain, max_output_tokens: 2 });
  ok(stillOk.output_text.length > 0, 'that server still answers other prompts');

  // ---- allocation failures injected into a running server
  const mix = [
    { ...plain }, { ...plain, stream: true }, { ...think }, { ...think, stream: true },
    { ...toolReq, max_output_tokens: 200, tool_choice: 'required' }, { ...toolReq, max_output_tokens: 200, tool_choice: 'required', stream: true },
    { ...toolReq, max_output_tokens: 12, input: round }, { ...lpReq },
  ];
  const keyOf = (x, isStream) => {
    if (isStream) {
      const f = fold(x.events);
      return f.err ? `stream error: ${f.err}` : JSON.stringify([noIds(f.output), f.end.type, f.end.response.usage?.output_tokens]);
    }
    return JSON.stringify([noIds(x.json?.output), x.json?.status, x.json?.usage?.output_tokens]);
  };
  const runQ = async (b, q) => q.stream ? rawStream(q, b) : post(b, '/v1/responses', q, AUTH);
  const expect = [];
  for (const q of mix) expect.push(keyOf(await runQ(base, q), q.stream));
  const oaiErr = j => j?.error && typeof j.error.message === 'string' && j.error.type === 'server_error';
  const oldEnv = process.env.M3_FAULT_ALLOC;
  process.env.M3_FAULT_ALLOC = 'server:200:30:397,engine:5:10:11,backend:300:10:150';
  let faultSrv;
  try { faultSrv = await startServer(m3, ck, ['--served-model-name', 'tiny', '--api-key', KEY]); }
  finally { if (oldEnv === undefined) delete process.env.M3_FAULT_ALLOC; else process.env.M3_FAULT_ALLOC = oldEnv; }
  others.push(faultSrv);
  const spent = m => m['m3_fault_injected_total{module="server"}'] >= 30 && m['m3_fault_injected_total{module="engine"}'] >= 10 &&
    m['m3_fault_injected_total{module="backend"}'] >= 10;
  let good = 0, clean = 0, closed = 0, rounds = 0;
  const broken = [];
  for (; rounds < 40; rounds++) {
    const res = await Promise.all(mix.map(q => runQ(faultSrv.base, q).catch(e => ({ status: 'exception', e }))));
    res.forEach((x, i) => {
      const q = mix[i];
      // a connection the server closed as it accepted it (no memory for its state): clean, as many as
      // /metrics counts (m3_http_connections_turned_away_total, checked below), as server_faults judges it
      if (x.status === 'exception') { closed++; return; }
      if (q.stream) {
        const f = x.status === 200 && !x.bad.length ? fold(x.events) : null;
        if (f && keyOf(x, true) === expect[i]) good++;
        // (a failure may come before response.created: then response.failed is the only event)
        else if (f && f.end?.type === 'response.failed' && f.end.response.status === 'failed' && typeof f.end.response.error?.message === 'string' &&
                 !x.events.some(e => e.event === 'response.completed' || e.event === 'response.incomplete')) clean++;
        else if (x.status === 500 && oaiErr(JSON.parse(x.text || 'null'))) clean++;
        else broken.push(`${i} stream: ${x.status} ${f?.err ?? ''} ${JSON.stringify((x.text || String(x.e)).slice(-300))}`);
      } else {
        if (x.status === 200 && keyOf(x, false) === expect[i]) good++;
        else if (x.status === 500 && oaiErr(x.json)) clean++;
        else broken.push(`${i}: ${x.status} ${(x.text || String(x.e)).slice(0, process.env.DBG ? 100000 : 300)}` + (process.env.DBG ? "\nEXPECTED " + expect[i] : ""));
      }
    });
    if (spent(await metrics(faultSrv.base))) break;
  }
  const fmx = await metrics(faultSrv.base);
  const away = fmx['m3_http_connections_turned_away_total'];
  ok(!broken.length && spent(fmx) && clean > 0 && Number.isFinite(away) && closed <= away,
     `under injected allocation failures (${rounds + 1} rounds, ${fmx['m3_fault_injected_total{module="server"}']} server / ${fmx['m3_fault_injected_total{module="engine"}']} engine failures): ` +
     `${good} answers equal to the clean server's, ${clean} clean errors, ${closed} connections closed as accepted (${away} turned away), ${broken.length} broken` + (broken.length ? ':\n  ' + broken.slice(0, 4).join('\n  ') : ''));
  let after = 0;
  for (let i = 0; i < mix.length; i++) after += keyOf(await runQ(faultSrv.base, mix[i]), mix[i].stream) === expect[i];
  ok(after === mix.length, `after the failures: ${after}/${mix.length} answers equal to the clean server's`);

  // ---- every allocation failing from the F-th on (memory gone for good): a stream that started
  // still ends with response.failed (made without allocating), never a bare 200; before it, a 500
  const ends = { failed: 0, refused: 0, whole: 0 }, bare = [];
  for (const F of [30, 60, 120, 240, 480, 960]) {
    const old2 = process.env.M3_FAULT_ALLOC;
    process.env.M3_FAULT_ALLOC = `server:${F}:-1:1`;
    let fs;
    try { fs = await startServer(m3, ck, ['--served-model-name', 'tiny', '--api-key', KEY]); }
    finally { if (old2 === undefined) delete process.env.M3_FAULT_ALLOC; else process.env.M3_FAULT_ALLOC = old2; }
    others.push(fs);
    const x = await rawStream({ ...plain, max_output_tokens: 6 }, fs.base).catch(e => ({ status: 'exception', e }));
    const f = x.status === 200 && !x.bad?.length ? fold(x.events) : null;
    if (f && !f.err && /^response\.(completed|incomplete)$/.test(f.end?.type)) ends.whole++;
    else if (f && f.end?.type === 'response.failed' && f.end.response.status === 'failed' && typeof f.end.response.error?.message === 'string') ends.failed++;
    else if (x.status === 500 || x.status === 'exception') ends.refused++;
    else bare.push(`F ${F}: ${x.status} ${f?.err} ${JSON.stringify(x.text ?? '').slice(-400)}`);
  }
  ok(!bare.length && ends.failed > 0, `memory gone from the F-th allocation on: ${ends.failed} streams ended with response.failed, ` +
     `${ends.refused} refused (500 or closed), ${ends.whole} whole${bare.length ? ': ' + bare.join('; ') : ''}`);

  ok(/req \d+ POST \/v1\/responses 200/.test(srv.log) && /GET \/v1\/responses\/resp_[0-9a-f]+ 200/.test(srv.log), 'the log names the endpoints');
} catch (e) {
  ok(false, 'unexpected: ' + (e.stack || e));
} finally {
  for (const o of others) {
    const e = await o.stop();
    ok(e.code === 0, `a second server exits cleanly (${e.code} ${e.signal ?? ''})` + (e.code === 0 ? '' : '\n' + o.log.slice(-4000)));
  }
  const st = await srv.stop();
  ok(st.code === 0, `server exits cleanly (${st.code})`);
}
console.log(`${R.failed ? 'FAILED' : 'PASSED'} (${R.failed} failures, ${((Date.now() - t0) / 1000).toFixed(1)} s)`);
process.exit(R.failed ? 1 : 0);
