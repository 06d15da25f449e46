// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens; issue 26) through the
// official @anthropic-ai/sdk, on a random-weight checkpoint:
//  - text: a greedy answer equals the OpenAI endpoint's for the same conversation (system blocks,
//    thinking off), usage equal to its prompt / completion tokens;
//  - streaming: Anthropic's event sequence (event: lines naming each data's type; message_start,
//    ping, content_block_start / _delta / _stop per block, message_delta, message_stop), whose text
//    and usage equal the non-stream answer's; the SDK's MessageStream accumulates the same message;
//  - thinking: enabled (and absent: the template's default) gives a thinking block equal to the
//    OpenAI reasoning, disabled none; budget_tokens closes the reasoning (as thinking_token_budget);
//    assistant thinking blocks in history render as reasoning;
//  - tools: tool_choice any / tool force a tool_use block (toolu_ id, the right tool) whose input
//    validates against input_schema (ajv), stream (the input in several input_json_delta pieces)
//    and non-stream; disable_parallel_tool_use: one call; a tool_result sent back is answered, and
//    the prompt is the one the OpenAI request with the same history renders (tokens and greedy
//    answer equal);
//  - a prefill (a final assistant message): the prompt is the plain prompt followed by the prefill's
//    tokens (the prefill being the plain greedy answer's first k tokens), the answer its continuation
//    alone (the plain answer's next tokens up to a near tie), equal to continue_final_message on the
//    OpenAI endpoint, streamed too, counted by count_tokens; after a thinking block; split over
//    assistant messages; an empty one is no prefill; consecutive user turns are one turn;
//  - stop_sequences: the text ends before the first occurrence, stop_reason stop_sequence and the
//    string named, stream too;
//  - errors in Anthropic's shape as the SDK's classes: missing max_tokens (BadRequestError), a bad key
//    (AuthenticationError), an unknown model (NotFoundError, the OpenAI endpoint's message), refused
//    block types, prefills that cannot be continued, bad JSON; x-api-key and Bearer both accepted;
//  - an engine failure (a NaN embedding row): a 500 api_error, or mid-stream an `event: error` that the
//    SDK throws, after message_start;
//  - allocation failures injected into a running server: every answer equal to the clean server's or
//    a clean error in Anthropic's shape, then the same answers again;
//  - structured outputs: output_config.format / output_format json_schema answers validate (ajv),
//    stream too; strict tools under tool_choice auto make only valid calls; refusals;
//  - count_tokens = usage.input_tokens; /metrics counts these requests.
// Usage: node tests/server/server_anthropic.mjs <m3-binary> <work-dir>
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import Ajv from 'ajv/dist/2020.js';
import { makeCheckpoint, nanCheckpoint, startServer, post, reporter, metrics } from './lib.mjs';

const [m3, work] = process.argv.slice(2);
if (!m3 || !work) { console.error('usage: node server_anthropic.mjs <m3-binary> <work-dir>'); process.exit(2); }
const R = reporter(), ok = R.ok;
const ck = makeCheckpoint(m3, work + '/ck');
const KEY = 'sk-m3-anthropic-test';
const srv = await startServer(m3, ck, ['--served-model-name', 'tiny', '--api-key', KEY]);
const base = srv.base;
const client = new Anthropic({ baseURL: base, apiKey: KEY, maxRetries: 0 });
const oai = new OpenAI({ baseURL: base + '/v1', apiKey: KEY, maxRetries: 0 });
const AUTH = { Authorization: `Bearer ${KEY}` };
const ajv = new Ajv({ strict: false, allErrors: true });
const t0 = Date.now();
let nanSrv = null, faultSrv = null;

const OFF = { type: 'disabled' };
const ON = { type: 'enabled', budget_tokens: 1024 };
const USER = [{ role: 'user', content: 'Hello there' }];
const SYSTEM = [{ type: 'text', text: 'You are terse. ' }, { type: 'text', text: 'Answer in French.' }];
const greedy = { model: 'tiny', temperature: 0 };

// the raw SSE of a streamed request: [{event, data}] plus anything that is not an event
async function rawStream(body, headers = { 'x-api-key': KEY }, on = base) {
  const r = await fetch(on + '/v1/messages', { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body: JSON.stringify({ ...body, stream: true }) });
  const text = await r.text();
  const events = [], bad = [];
  for (const ev of text.split('\n\n')) {
    if (!ev || ev.startsWith(':')) continue;
    const m = /^event: ([a-z_]+)\ndata: (.*)$/s.exec(ev);
    if (!m) { bad.push(ev); continue; }
    try { events.push({ event: m[1], data: JSON.parse(m[2]) }); } catch { bad.push(ev); }
  }
  return { status: r.status, events, bad, text };
}

// the SDK's stream of events folded into the blocks it describes; checks the order of events
function fold(events) {
  const blocks = [];
  let open = -1, err = null, start = null, delta = null, stops = 0;
  const names = events.map(e => e.type);
  for (const e of events) {
    if (e.type === 'message_start') { if (start || blocks.length) err ??= 'message_start not first'; start = e.message; }
    else if (e.type === 'ping') {}
    else if (e.type === 'content_block_start') {
      if (open >= 0) err ??= `block ${e.index} starts while ${open} is open`;
      if (e.index !== blocks.length) err ??= `block index ${e.index}, expected ${blocks.length}`;
      blocks.push({ ...e.content_block, _json: '' });
      open = e.index;
    } else if (e.type === 'content_block_delta') {
      if (e.index !== open) { err ??= `delta for ${e.index} while ${open} is open`; continue; }
      const b = blocks[open], d = e.delta;
      if (d.type === 'text_delta' && b.type === 'text') b.text += d.text;
      else if (d.type === 'thinking_delta' && b.type === 'thinking') b.thinking += d.thinking;
      else if (d.type === 'input_json_delta' && b.type === 'tool_use') { b._json += d.partial_json; b._pieces = (b._pieces || 0) + 1; }
      else err ??= `${d.type} in a ${b.type} block`;
    } else if (e.type === 'content_block_stop') {
      if (e.index !== open) err ??= `stop for ${e.index} while ${open} is open`;
      open = -1;
    } else if (e.type === 'message_delta') { if (open >= 0) err ??= 'message_delta with a block open'; delta = e; }
    else if (e.type === 'message_stop') { stops++; if (!delta) err ??= 'message_stop before message_delta'; }
    else err ??= `unexpected event ${e.type}`;
  }
  if (!start) err ??= 'no message_start';
  if (names[names.length - 1] !== 'message_stop' || stops !== 1) err ??= `does not end with one message_stop: ${names.slice(-3)}`;
  for (const b of blocks) if (b.type === 'tool_use') { try { b.input = JSON.parse(b._json || '{}'); } catch { err ??= `tool input does not parse: ${b._json}`; } }
  for (const b of blocks) delete b._json;
  return { blocks, err, start, delta, names };
}

async function streamed(body) {
  const events = [];
  for await (const e of await client.messages.create({ ...body, stream: true })) events.push(e);
  return fold(events);
}

const textOf = m => m.content.filter(b => b.type === 'text').map(b => b.text).join('');
const thinkingOf = m => m.content.filter(b => b.type === 'thinking').map(b => b.thinking).join('');
const strip = blocks => blocks.map(({ _pieces, ...b }) => b);
const noIds = blocks => blocks.map(({ _pieces, id, ...b }) => b); // tool_use ids differ between responses

// expects the promise to fail with the SDK's class cls, status and Anthropic error type
async function refused(p, cls, status, type, what, re) {
  try {
    await p;
    ok(false, `${what}: accepted`);
  } catch (e) {
    const good = e instanceof cls && e.status === status && e.error?.type === 'error' && e.error?.error?.type === type && (!re || re.test(e.error.error.message));
    ok(good, `${what}: ${e.constructor.name} ${e.status} ${e.error?.error?.type}: ${e.error?.error?.message ?? e.message}`);
    return e;
  }
}

try {
  // ---- text, non-stream, against the OpenAI endpoint with the same conversation
  const plain = { ...greedy, max_tokens: 24, system: SYSTEM, messages: USER, thinking: OFF, metadata: { user_id: 'u1' } };
  const m1 = await client.messages.create(plain);
  ok(/^msg_[0-9a-f]{32}$/.test(m1.id) && m1.type === 'message' && m1.role === 'assistant' && m1.model === 'tiny',
     `a message: ${m1.id}, type ${m1.type}, role ${m1.role}, model ${m1.model}`);
  ok(m1.content.length === 1 && m1.content[0].type === 'text' && m1.content[0].text.length > 0,
     `thinking disabled: one text block (${JSON.stringify(m1.content[0]?.text)?.slice(0, 60)})`);
  ok(m1.stop_reason === 'max_tokens' && m1.stop_sequence === null && m1.usage.output_tokens === 24,
     `stop_reason ${m1.stop_reason}, usage ${JSON.stringify(m1.usage)}`);
  const o1 = await oai.chat.completions.create({ ...greedy, max_tokens: 24, chat_template_kwargs: { enable_thinking: false },
    messages: [{ role: 'system', content: 'You are terse. Answer in French.' }, ...USER] });
  ok(o1.choices[0].message.content === m1.content[0].text && o1.usage.prompt_tokens === m1.usage.input_tokens &&
     o1.usage.completion_tokens === m1.usage.output_tokens,
     `the same text and usage as /v1/chat/completions (${o1.usage.prompt_tokens} prompt tokens)`);
  const ids = new Set();
  for (let i = 0; i < 3; i++) ids.add((await client.messages.create({ ...plain, max_tokens: 1 })).id);
  ok(ids.size === 3, 'message ids differ between requests');

  // ---- streaming: the event sequence, its text and usage = the non-stream answer
  const raw = await rawStream(plain);
  const evNames = raw.events.map(e => e.event);
  ok(raw.status === 200 && !raw.bad.length && raw.events.every(e => e.event === e.data.type),
     `stream: every event is 'event: NAME' + 'data: {type: NAME}' (${raw.events.length} events, ${raw.bad.length} malformed)`);
  const f1 = fold(raw.events.map(e => e.data));
  ok(!f1.err && evNames[0] === 'message_start' && evNames.includes('ping'), `stream: event order (${f1.err || evNames.slice(0, 4).join(', ') + ', ...'})`);
  ok(f1.blocks.length === 1 && f1.blocks[0].type === 'text' && f1.blocks[0].text === m1.content[0].text,
     'stream: the text deltas add up to the non-stream text');
  ok(f1.delta?.delta.stop_reason === 'max_tokens' && f1.delta.delta.stop_sequence === null && f1.delta.usage.output_tokens === 24 &&
     f1.start.usage.input_tokens === m1.usage.input_tokens && /^msg_[0-9a-f]{32}$/.test(f1.start.id) && f1.start.content.length === 0,
     `stream: message_start (input_tokens ${f1.start?.usage.input_tokens}) and message_delta (${JSON.stringify(f1.delta?.delta)}, ${JSON.stringify(f1.delta?.usage)})`);
  const fin = await client.messages.stream(plain).finalMessage();
  ok(JSON.stringify(fin.content) === JSON.stringify(m1.content) && fin.stop_reason === m1.stop_reason && fin.usage.output_tokens === 24,
     "the SDK's MessageStream accumulates the non-stream message");

  // ---- thinking on / absent / off
  const think = { ...greedy, max_tokens: 20, messages: USER };
  const mOn = await client.messages.create({ ...think, thinking: ON });
  const mDef = await client.messages.create(think);
  const oOn = await oai.chat.completions.create({ ...greedy, max_tokens: 20, messages: USER });
  ok(mOn.content.length >= 1 && mOn.content[0].type === 'thinking' && mOn.content[0].thinking.length > 0 && mOn.content[0].signature === '',
     `thinking enabled: a thinking block first (${JSON.stringify(mOn.content[0]?.thinking)?.slice(0, 50)})`);
  ok(thinkingOf(mOn) === oOn.choices[0].message.reasoning_content && textOf(mOn) === (oOn.choices[0].message.content || ''),
     'thinking enabled: the thinking is the OpenAI endpoint\'s reasoning, the text its content');
  ok(JSON.stringify(mDef.content) === JSON.stringify(mOn.content), 'thinking absent: the template\'s default (enabled)');
  const fOn = await streamed({ ...think, thinking: ON });
  ok(!fOn.err && JSON.stringify(strip(fOn.blocks)) === JSON.stringify(mOn.content), `thinking stream: thinking_delta events add up to the same blocks${fOn.err ? ' (' + fOn.err + ')' : ''}`);
  // budget_tokens closes the reasoning after that many tokens (vLLM's thinking_token_budget)
  const mB = await client.messages.create({ ...think, thinking: { type: 'enabled', budget_tokens: 4 } });
  const oB = (await post(base, '/v1/chat/completions', { ...greedy, max_tokens: 20, messages: USER, thinking_token_budget: 4, return_token_ids: true }, AUTH)).json;
  const tB = oB?.choices?.[0]?.token_ids ?? [], closeAt = tB.indexOf((await post(base, '/tokenize', { model: 'tiny', prompt: '</mm:think>' }, AUTH)).json?.tokens?.[0]);
  ok(thinkingOf(mB) === (oB?.choices?.[0]?.message?.reasoning_content ?? '') && textOf(mB) === (oB?.choices?.[0]?.message?.content ?? '') &&
     closeAt === 4 && thinkingOf(mOn).startsWith(thinkingOf(mB)) && thinkingOf(mOn).length > thinkingOf(mB).length && textOf(mB).length > 0,
     `budget_tokens 4: the reasoning closes at its 5th token (at ${closeAt}), then text; the OpenAI endpoint's with thinking_token_budget 4`);
  const mOff = await client.messages.create({ ...think, thinking: OFF });
  ok(mOff.content.every(b => b.type !== 'thinking') && textOf(mOff).length > 0, 'thinking disabled: no thinking block');
  // assistant thinking blocks in history go where the template writes reasoning
  const hist = [...USER, { role: 'assistant', content: [{ type: 'thinking', thinking: 'They greet me.', signature: 'x' },
    { type: 'redacted_thinking', data: 'opaque' }, { type: 'text', text: 'Bonjour.' }] }, { role: 'user', content: 'Encore?' }];
  const ctHist = await client.messages.countTokens({ model: 'tiny', messages: hist, thinking: OFF });
  const tkHist = (await post(base, '/tokenize', { messages: [...USER, { role: 'assistant', content: 'Bonjour.', reasoning_content: 'They greet me.' },
    { role: 'user', content: 'Encore?' }], chat_template_kwargs: { enable_thinking: false } }, AUTH)).json;
  const prompt = (await post(base, '/detokenize', { tokens: tkHist.tokens }, AUTH)).json.prompt;
  ok(ctHist.input_tokens === tkHist.count && prompt.includes('<mm:think>They greet me.</mm:think>Bonjour.'),
     `history thinking blocks: the prompt of reasoning_content (${ctHist.input_tokens} tokens = ${tkHist.count})`);

  // ---- tools: forced calls validate; a round trip
  const weather = { name: 'get_weather', description: 'The weather in a city',
    input_schema: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] }, unit: { enum: ['celsius', 'fahrenheit'] },
      days: { type: 'integer', enum: [1, 2, 3] } }, required: ['city', 'unit', 'days'] } };
  const clock = { name: 'get_time', description: 'The time in a zone', input_schema: { type: 'object', properties: { zone: { enum: ['UTC', 'CET'] } }, required: ['zone'] } };
  const TOOLS = [weather, clock];
  const schemaOf = Object.fromEntries(TOOLS.map(t => [t.name, ajv.compile(t.input_schema)]));
  const toolReq = { ...greedy, max_tokens: 400, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: TOOLS, thinking: OFF };
  const checkUses = (m, name, what) => {
    const uses = m.content.filter(b => b.type === 'tool_use');
    const bad = uses.map(u => !/^toolu_[0-9A-Za-z_]+$/.test(u.id) ? `id ${u.id}` : name && u.name !== name ? `tool ${u.name}` :
      !schemaOf[u.name] ? `unknown tool ${u.name}` : !schemaOf[u.name](u.input) ? `input ${JSON.stringify(u.input)}: ${ajv.errorsText(schemaOf[u.name].errors)}` : null).filter(Boolean);
    ok(uses.length === 1 && !bad.length && m.stop_reason === 'tool_use',
       `${what}: ${uses.length} tool_use block(s) ${uses.map(u => u.name + JSON.stringify(u.input)).join(' ')} stop_reason ${m.stop_reason} ${bad.join('; ')}`);
    return uses;
  };
  const tAny = await client.messages.create({ ...toolReq, tool_choice: { type: 'any', disable_parallel_tool_use: true } });
  const [use] = checkUses(tAny, null, 'tool_choice any (one call)');
  const tNamed = await client.messages.create({ ...toolReq, tool_choice: { type: 'tool', name: 'get_time', disable_parallel_tool_use: true } });
  checkUses(tNamed, 'get_time', 'tool_choice tool get_time');
  const fTool = await streamed({ ...toolReq, tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true } });
  const nTool = await client.messages.create({ ...toolReq, tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true } });
  const sUse = fTool.blocks.find(b => b.type === 'tool_use');
  ok(!fTool.err && sUse && sUse._pieces > 1 && fTool.delta.delta.stop_reason === 'tool_use' &&
     JSON.stringify(noIds(fTool.blocks)) === JSON.stringify(noIds(nTool.content)) && /^toolu_/.test(sUse.id),
     `tool stream: content_block_start tool_use + ${sUse?._pieces} input_json_delta piece(s) = the non-stream blocks${fTool.err ? ' (' + fTool.err + ')' : ''}`);
  const anyMany = await client.messages.create({ ...toolReq, tool_choice: { type: 'any' } });
  // (a random model may go on calling until max_tokens: every call it completed is valid)
  const many = anyMany.content.filter(b => b.type === 'tool_use');
  ok(many.length >= 1 && many.every(u => schemaOf[u.name]?.(u.input)) && new Set(many.map(u => u.id)).size === many.length &&
     ['tool_use', 'max_tokens'].includes(anyMany.stop_reason),
     `tool_choice any, parallel allowed: ${many.length} valid call(s), distinct ids, stop_reason ${anyMany.stop_reason}`);
  const fMany = await streamed({ ...toolReq, tool_choice: { type: 'any' } });
  ok(!fMany.err && JSON.stringify(noIds(fMany.blocks)) === JSON.stringify(noIds(anyMany.content)) && fMany.delta.delta.stop_reason === anyMany.stop_reason,
     `stream of several calls: blocks ${fMany.blocks.map(b => b.type).join(', ')} open and close in turn, as the non-stream content${fMany.err ? ' (' + fMany.err + ')' : ''}`);
  // tool_choice none: the tool-call parser is off, as OpenAI's "none"
  const tNone = await client.messages.create({ ...toolReq, max_tokens: 8, tool_choice: { type: 'none' } });
  const oNone = await oai.chat.completions.create({ ...greedy, max_tokens: 8, messages: toolReq.messages, tool_choice: 'none', chat_template_kwargs: { enable_thinking: false },
    tools: TOOLS.map(t => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.input_schema } })) });
  ok(textOf(tNone) === oNone.choices[0].message.content && tNone.stop_reason === 'max_tokens', 'tool_choice none: as OpenAI\'s "none"');

  // ---- structured outputs: output_config.format (and the beta's top-level output_format) make the
  // answer a JSON document of the schema; strict tools pass through (every call valid under auto)
  const OUT = { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome'] }, temp: { type: 'integer', minimum: -20, maximum: 45 } },
                required: ['city', 'temp'], additionalProperties: false };
  const outOk = ajv.compile(OUT);
  const jReq = { model: 'tiny', temperature: 1, max_tokens: 200, messages: USER, thinking: OFF };
  const jsonOf = m => { try { return JSON.parse(textOf(m)); } catch { return undefined; } };
  const oc = await Promise.all([1, 2, 3].map(seed => client.messages.create({ ...jReq, metadata: { user_id: `u${seed}` }, top_k: 50 + seed, output_config: { format: { type: 'json_schema', schema: OUT } } })));
  ok(oc.every(m => outOk(jsonOf(m)) && m.stop_reason === 'end_turn'), `output_config.format json_schema: ${oc.map(m => textOf(m).replace(/\s+/g, '')).join(' ')} validate, end_turn`);
  const ofb = await client.messages.create({ ...jReq, output_format: { type: 'json_schema', schema: OUT } });
  ok(outOk(jsonOf(ofb)), `the beta's output_format: ${textOf(ofb).replace(/\s+/g, '')}`);
  const ocs = await streamed({ ...jReq, output_config: { format: { type: 'json_schema', schema: OUT }, effort: 'low' } });
  ok(!ocs.err && outOk((() => { try { return JSON.parse(ocs.blocks.map(b => b.text || '').join('')); } catch { return undefined; } })()), 'output_config.format, streamed (effort accepted)');
  const strictTools = TOOLS.map(t => ({ ...t, strict: true }));
  const st = await Promise.all([1, 2, 3].map(k => client.messages.create({ ...toolReq, temperature: 1, top_k: 40 + k, max_tokens: 60, tools: strictTools, tool_choice: { type: 'auto' } })));
  const stUses = st.flatMap(m => m.content.filter(b => b.type === 'tool_use'));
  ok(st.every(m => ['end_turn', 'max_tokens', 'tool_use'].includes(m.stop_reason)) && stUses.every(u => schemaOf[u.name]?.(u.input)),
     `strict tools, tool_choice auto: ${stUses.length} call(s), all valid; stop_reason ${st.map(m => m.stop_reason).join(' ')}`);
  await refused(client.messages.create({ ...jReq, output_config: { format: { type: 'json_schema', schema: { type: 'string', format: 'uri' } } } }),
                Anthropic.BadRequestError, 400, 'invalid_request_error', 'output_config.format with a refused schema', /unsupported "format": "uri"/);
  await refused(client.messages.create({ ...jReq, output_config: { format: { type: 'text' } } }), Anthropic.BadRequestError, 400, 'invalid_request_error',
                'output_config.format of another type', /json_schema/);
  await refused(client.messages.create({ ...jReq, output_format: { type: 'json_schema', schema: OUT }, output_config: { format: { type: 'json_schema', schema: OUT } } }),
                Anthropic.BadRequestError, 400, 'invalid_request_error', 'output_format beside output_config.format', /give one of them/);

  // the round trip: the tool_use goes back with its tool_result
  const round = [...toolReq.messages, { role: 'assistant', content: tAny.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: [{ type: 'text', text: '18 degrees, sunny' }] }, { type: 'text', text: 'Thanks!' }] }];
  const answer = await client.messages.create({ ...toolReq, max_tokens: 16, messages: round });
  const oaiRound = [...toolReq.messages, { role: 'assistant', content: [], tool_calls: [{ id: use.id, type: 'function', function: { name: use.name, arguments: JSON.stringify(use.input) } }] },
    { role: 'tool', tool_call_id: use.id, content: '18 degrees, sunny' }, { role: 'user', content: 'Thanks!' }];
  const oTools = TOOLS.map(t => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.input_schema } }));
  const oAnswer = await oai.chat.completions.create({ ...greedy, max_tokens: 16, messages: oaiRound, tools: oTools, chat_template_kwargs: { enable_thinking: false } });
  const tkRound = (await post(base, '/tokenize', { messages: oaiRound, tools: oTools, chat_template_kwargs: { enable_thinking: false } }, AUTH)).json;
  const pRound = (await post(base, '/detokenize', { tokens: tkRound.tokens }, AUTH)).json.prompt;
  ok(answer.content.length >= 1 && answer.usage.input_tokens === tkRound.count && answer.usage.input_tokens === oAnswer.usage.prompt_tokens &&
     textOf(answer) === oAnswer.choices[0].message.content,
     `tool_result round trip: answered (${answer.stop_reason}); the prompt = the OpenAI history's (${tkRound.count} tokens), the same greedy answer`);
  ok(pRound.includes(`]<]minimax[>[<city>${use.input.city}]<]minimax[>[</city>`) && pRound.includes(']~b]tool\n18 degrees, sunny[e~['),
     'the prompt writes the call as the model does and the result as a tool turn');
  const errRound = [...round.slice(0, 2), { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'no such city', is_error: true }] }];
  const ctErr = await client.messages.countTokens({ model: 'tiny', messages: errRound, tools: TOOLS, thinking: OFF });
  const tkErr = (await post(base, '/tokenize', { messages: [...oaiRound.slice(0, 2), { role: 'tool', tool_call_id: use.id, content: 'Error: no such city' }],
    tools: oTools, chat_template_kwargs: { enable_thinking: false } }, AUTH)).json;
  ok(ctErr.input_tokens === tkErr.count, `is_error: the result reads "Error: ..." (${ctErr.input_tokens} = ${tkErr.count} tokens)`);

  // ---- stop_sequences: the greedy text of m1 cut at a piece of itself
  const full = m1.content[0].text;
  let stopStr = null;
  for (let k = Math.floor(full.length / 2); k < full.length - 2 && !stopStr; k++) {
    const cand = full.slice(k, k + 2);
    if (full.indexOf(cand) > 0 && cand.trim().length === 2) stopStr = cand;
  }
  const cut = full.slice(0, full.indexOf(stopStr));
  const mStop = await client.messages.create({ ...plain, stop_sequences: ['never appears', stopStr] });
  ok(mStop.stop_reason === 'stop_sequence' && mStop.stop_sequence === stopStr && textOf(mStop) === cut,
     `stop_sequences ${JSON.stringify(stopStr)}: text ${JSON.stringify(textOf(mStop))} ends before it, stop_reason ${mStop.stop_reason}, stop_sequence ${JSON.stringify(mStop.stop_sequence)}`);
  const fStop = await streamed({ ...plain, stop_sequences: [stopStr] });
  ok(!fStop.err && fStop.delta.delta.stop_reason === 'stop_sequence' && fStop.delta.delta.stop_sequence === stopStr &&
     fStop.blocks.map(b => b.text).join('') === cut, 'stop_sequences stream: message_delta names it, the text is the same');

  // ---- count_tokens = usage.input_tokens
  const ct1 = await client.messages.countTokens({ model: 'tiny', system: SYSTEM, messages: USER, thinking: OFF });
  const ctTools = await client.messages.countTokens({ model: 'tiny', messages: toolReq.messages, tools: TOOLS, thinking: OFF, tool_choice: { type: 'any' } });
  ok(ct1.input_tokens === m1.usage.input_tokens && ctTools.input_tokens === tAny.usage.input_tokens && ctTools.input_tokens > ct1.input_tokens,
     `count_tokens: ${ct1.input_tokens} = usage.input_tokens ${m1.usage.input_tokens}; with tools ${ctTools.input_tokens} = ${tAny.usage.input_tokens}`);

  // ---- a prefill (a final assistant message): the answer continues it. The prefill is the text of
  // the first k tokens of the plain greedy answer (thinking adaptive: the generation prompt is the
  // assistant turn's opening, which the final message's rendering shares), so the prompt must be
  // exactly the plain prompt followed by those k tokens.
  const AD = { type: 'adaptive' }, adKw = { thinking_mode: 'adaptive' };
  const pl = (await post(base, '/v1/chat/completions', { ...greedy, max_tokens: 24, messages: USER, chat_template_kwargs: adKw,
    return_token_ids: true, ignore_eos: true }, AUTH)).json;
  const P = pl?.prompt_token_ids ?? [], T = pl?.choices?.[0]?.token_ids ?? [];
  ok(P.length > 0 && T.length === 24, `the plain answer's ids: ${P.length} prompt, ${T.length} generated`);
  let k = 0, pre = null, preIds = null;
  for (let j = 10; j >= 1 && !pre; j--) { // the longest cut whose text tokenizes back to the same ids
    const text = (await post(base, '/detokenize', { model: 'tiny', tokens: T.slice(0, j) }, AUTH)).json?.prompt;
    if (typeof text !== 'string' || !text.trim() || /\s$/.test(text) || text.includes('\ufffd') || text.includes('<mm:think>')) continue;
    const tk = (await post(base, '/tokenize', { model: 'tiny', messages: [...USER, { role: 'assistant', content: text }],
      add_generation_prompt: false, continue_final_message: true, chat_template_kwargs: adKw }, AUTH)).json;
    if (JSON.stringify(tk?.tokens) === JSON.stringify([...P, ...T.slice(0, j)])) { k = j; pre = text; preIds = tk.tokens; }
  }
  ok(pre !== null, `a prefill of the answer's first ${k} tokens (${JSON.stringify(pre)}) is the plain prompt + those tokens`);
  const preReq = { ...greedy, max_tokens: 12, messages: [...USER, { role: 'assistant', content: pre ?? 'Bon' }], thinking: AD };
  const mp = await client.messages.create(preReq);
  ok(mp.usage.input_tokens === preIds?.length, `the prefill's prompt: ${mp.usage.input_tokens} tokens (the plain prompt ${P.length} + ${k})`);
  ok(mp.content.length === 1 && mp.content[0].type === 'text' && mp.content[0].text.length > 0 && !mp.content[0].text.startsWith(pre),
     `the answer is the continuation alone, in a text block (${JSON.stringify(textOf(mp)).slice(0, 60)})`);
  // the same prompt through the OpenAI endpoint's continue_final_message: the same tokens
  const op = (await post(base, '/v1/chat/completions', { ...greedy, max_tokens: 12, messages: preReq.messages, chat_template_kwargs: adKw,
    add_generation_prompt: false, continue_final_message: true, return_token_ids: true }, AUTH)).json;
  ok(op?.choices?.[0]?.message?.content === textOf(mp) && op.usage.prompt_tokens === mp.usage.input_tokens &&
     op.usage.completion_tokens === mp.usage.output_tokens, 'the same answer as continue_final_message on /v1/chat/completions');
  // greedy: the continuation is the plain answer's next tokens (until a near tie: the prefill ran as
  // one prefill, the plain answer token by token)
  const lp = (await post(base, '/v1/chat/completions', { ...greedy, max_tokens: 24, messages: USER, chat_template_kwargs: adKw,
    logprobs: true, top_logprobs: 2, ignore_eos: true }, AUTH)).json?.choices?.[0]?.logprobs?.content ?? [];
  const C = op?.choices?.[0]?.token_ids ?? [];
  let same = 0;
  while (same < C.length && k + same < T.length && C[same] === T[k + same]) same++;
  const tie = j => { const t = lp[j]?.top_logprobs; return t?.length === 2 && t[0].logprob - t[1].logprob < 1e-3; };
  ok(C.length > 0 && (same === Math.min(C.length, T.length - k) || tie(k + same)),
     `the continuation is the plain answer's tokens ${k}.. (${same} of ${C.length} equal${same < C.length ? ', then a near tie' : ''})`);
  const ctp = await client.messages.countTokens({ model: 'tiny', messages: preReq.messages, thinking: AD });
  ok(ctp.input_tokens === mp.usage.input_tokens, `count_tokens counts the prefill's prompt (${ctp.input_tokens})`);
  const sp = await streamed(preReq);
  ok(!sp.err && sp.blocks.length === 1 && sp.blocks[0].type === 'text' && sp.blocks[0].text === textOf(mp), `streamed: the same continuation (${sp.err ?? 'events in order'})`);
  // as blocks, with a thinking block before the text (its reasoning rendered in the turn): the
  // OpenAI request with that reasoning_content, continued
  const blk = [...USER, { role: 'assistant', content: [{ type: 'thinking', thinking: 'Short.', signature: '' }, { type: 'text', text: 'Bon' }] }];
  const mb = await client.messages.create({ ...greedy, max_tokens: 8, messages: blk, thinking: ON });
  const ob = await oai.chat.completions.create({ ...greedy, max_tokens: 8, chat_template_kwargs: { thinking_mode: 'enabled' },
    messages: [...USER, { role: 'assistant', content: 'Bon', reasoning_content: 'Short.' }], add_generation_prompt: false, continue_final_message: true });
  ok(mb.content.every(b => b.type === 'text') && textOf(mb) === (ob.choices[0].message.content ?? '') && mb.usage.input_tokens === ob.usage.prompt_tokens,
     `thinking on, a prefill after a thinking block: the continuation as text (${mb.usage.input_tokens} prompt tokens, as the OpenAI request's)`);
  // consecutive turns of one role are one turn (Anthropic's rule): the prompt of the merged message
  const two = await client.messages.create({ ...greedy, max_tokens: 6, thinking: OFF,
    messages: [{ role: 'user', content: 'Hello' }, { role: 'user', content: [{ type: 'text', text: ' there' }] }] });
  const one = await client.messages.create({ ...greedy, max_tokens: 6, thinking: OFF,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello' }, { type: 'text', text: ' there' }] }] });
  const splitPre = await client.messages.create({ ...preReq, messages: [...USER, { role: 'assistant', content: (pre ?? 'Bon').slice(0, 3) },
    { role: 'assistant', content: (pre ?? 'Bon').slice(3) }, { role: 'assistant', content: '' }] });
  ok(two.usage.input_tokens === one.usage.input_tokens && textOf(two) === textOf(one) &&
     splitPre.usage.input_tokens === mp.usage.input_tokens && textOf(splitPre) === textOf(mp),
     'consecutive user messages: one turn (the prompt and answer of one message with both blocks); a prefill split over assistant messages: the same');
  // an empty final assistant message is no prefill: the answer of the plain request
  const me = await client.messages.create({ ...plain, messages: [...USER, { role: 'assistant', content: '' }] });
  ok(textOf(me) === textOf(m1) && me.usage.input_tokens === m1.usage.input_tokens, 'an empty final assistant message: the plain answer');

  // ---- errors, in Anthropic's shape, as the SDK's classes
  await refused(client.messages.create({ model: 'tiny', messages: USER }), Anthropic.BadRequestError, 400, 'invalid_request_error', 'no max_tokens', /max_tokens/);
  await refused(new Anthropic({ baseURL: base, apiKey: 'wrong', maxRetries: 0 }).messages.create(plain), Anthropic.AuthenticationError, 401, 'authentication_error', 'a wrong x-api-key');
  await refused(new Anthropic({ baseURL: base, apiKey: 'wrong', maxRetries: 0 }).messages.countTokens({ model: 'tiny', messages: USER }), Anthropic.AuthenticationError, 401, 'authentication_error', 'count_tokens with a wrong key');
  const viaBearer = await new Anthropic({ baseURL: base, apiKey: null, authToken: KEY, maxRetries: 0 }).messages.create({ ...plain, max_tokens: 2 });
  ok(viaBearer.content.length === 1, 'Authorization: Bearer KEY works as x-api-key does');
  const xOnOpenAI = await fetch(base + '/v1/models', { headers: { 'x-api-key': KEY } });
  ok(xOnOpenAI.status === 200, 'x-api-key is accepted by the OpenAI endpoints too');
  const nf = await refused(client.messages.create({ ...plain, model: 'nope' }), Anthropic.NotFoundError, 404, 'not_found_error', 'an unknown model');
  let oaiMsg = null;
  try { await oai.chat.completions.create({ model: 'nope', max_tokens: 4, messages: USER }); } catch (e) { oaiMsg = e.error?.message; }
  ok(nf && oaiMsg && nf.error.error.message === oaiMsg, `the unknown model: the OpenAI endpoint's message (${oaiMsg})`);
  await refused(client.messages.create({ ...plain, temperature: 5 }), Anthropic.BadRequestError, 400, 'invalid_request_error', 'temperature 5', /temperature/);
  await refused(client.messages.create({ ...plain, messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'x' } }] }] }),
                Anthropic.BadRequestError, 400, 'invalid_request_error', 'a document block', /document/);
  await refused(client.messages.create({ ...plain, messages: [...USER, { role: 'assistant', content: 'Bon ' }] }), Anthropic.BadRequestError, 400, 'invalid_request_error', 'a prefill ending in a space', /trailing whitespace/);
  await refused(client.messages.create({ ...plain, messages: [...USER, { role: 'assistant', content: [{ type: 'text', text: 'Bon' }, { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: {} }] }] }),
                Anthropic.BadRequestError, 400, 'invalid_request_error', 'a prefill holding a tool_use block', /tool_use/);
  await refused(client.messages.create({ ...plain, tools: [{ type: 'web_search_20250305', name: 'web_search' }] }), Anthropic.BadRequestError, 400, 'invalid_request_error', 'a server tool', /web_search/);
  await refused(client.messages.create({ ...plain, tool_choice: { type: 'tool', name: 'nope' }, tools: TOOLS }), Anthropic.BadRequestError, 400, 'invalid_request_error', 'tool_choice naming no tool', /nope/);
  await refused(client.messages.create({ ...plain, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } }] }] }),
                Anthropic.BadRequestError, 400, 'invalid_request_error', 'an image on a model without a vision tower');
  await refused(client.messages.create({ ...plain, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }] }] }),
                Anthropic.BadRequestError, 400, 'invalid_request_error', 'an image url (nothing is fetched)');
  const badJson = await post(base, '/v1/messages', '{"model": ', { 'x-api-key': KEY });
  ok(badJson.status === 400 && badJson.json?.type === 'error' && badJson.json.error.type === 'invalid_request_error', `bad JSON: ${badJson.text}`);
  const noKey = await post(base, '/v1/messages', plain);
  ok(noKey.status === 401 && noKey.json?.type === 'error' && noKey.json.error.type === 'authentication_error', 'no key: 401 in Anthropic\'s shape');
  const streamErr = await rawStream({ ...plain, model: 'nope' });
  ok(streamErr.status === 404 && JSON.parse(streamErr.text).error.type === 'not_found_error', 'a stream refused before it starts: a plain error body');

  // ---- an error mid-stream: a copy of the checkpoint with one token's embedding row NaN, so that
  // a prompt holding it fails in the engine after the stream has begun
  const bad = (await post(base, '/tokenize', { prompt: ' zebra' }, AUTH)).json.tokens[0];
  const nck = nanCheckpoint(ck, work + '/nan-ck', bad);
  nanSrv = await startServer(m3, nck, ['--served-model-name', 'tiny', '--max-body', '65536']);
  const nan = new Anthropic({ baseURL: nanSrv.base, apiKey: 'none', maxRetries: 0 });
  const zebra = { ...plain, messages: [{ role: 'user', content: 'A zebra' }] };
  await refused(nan.messages.create(zebra), Anthropic.InternalServerError, 500, 'api_error', 'the engine fails (non-stream): 500 api_error', /non-finite/);
  const midRaw = await (await fetch(nanSrv.base + '/v1/messages', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ ...zebra, stream: true }) })).text();
  const mid = midRaw.split('\n\n').filter(Boolean).map(ev => /^event: (\w+)\ndata: (.*)$/s.exec(ev)).map(m => m && { event: m[1], data: JSON.parse(m[2]) });
  const last = mid[mid.length - 1];
  ok(mid.every(Boolean) && mid[0].event === 'message_start' && last.event === 'error' && last.data.type === 'error' &&
     last.data.error.type === 'api_error' && /non-finite/.test(last.data.error.message) && !mid.some(e => e.event === 'message_stop'),
     `the engine fails mid-stream: message_start, ..., event: error (${mid.map(e => e?.event).join(', ')})`);
  let sdkErr = null;
  try { for await (const e of await nan.messages.create({ ...zebra, stream: true })) void e; } catch (e) { sdkErr = e; }
  ok(sdkErr instanceof Anthropic.APIError && sdkErr.error?.error?.type === 'api_error', `the SDK's stream throws it: ${sdkErr?.constructor.name} ${sdkErr?.message}`);
  const stillOk = await nan.messages.create({ ...plain, max_tokens: 2 });
  ok(stillOk.content.length === 1, 'that server still answers other prompts');
  // the HTTP layer's own refusals answer in the endpoint's shape too: a body over --max-body
  const big = { ...plain, messages: [{ role: 'user', content: 'x'.repeat(100000) }] };
  await refused(nan.messages.create(big), Anthropic.APIError, 413, 'request_too_large', 'a body over --max-body: 413 request_too_large');
  const bigOai = await post(nanSrv.base, '/v1/chat/completions', { model: 'tiny', max_tokens: 1, messages: big.messages });
  ok(bigOai.status === 413 && bigOai.json?.error?.type === 'invalid_request_error' && !bigOai.json.type, 'the same on /v1/chat/completions: OpenAI\'s shape');

  // ---- allocation failures injected into a running server (M3_FAULT_ALLOC, as server_faults does):
  // every answer is the clean server's or a clean error in Anthropic's shape (a 500 api_error, or a
  // stream ending with event: error), never a broken one; then it answers as the clean server
  const mix = [
    { ...plain }, { ...plain, stream: true }, { ...think, thinking: ON }, { ...think, thinking: ON, stream: true },
    { ...toolReq, max_tokens: 200, tool_choice: { type: 'any' } }, { ...toolReq, max_tokens: 200, tool_choice: { type: 'any' }, stream: true },
    { ...plain, stop_sequences: [stopStr] }, { ...toolReq, max_tokens: 12, messages: round },
  ];
  const keyOf = (x, isStream) => {
    if (isStream) {
      const f = fold(x.events.map(e => e.data));
      return f.err ? `stream error: ${f.err}` : JSON.stringify([noIds(f.blocks), f.delta.delta, f.delta.usage]);
    }
    return JSON.stringify([noIds(x.json.content), x.json.stop_reason, x.json.stop_sequence, x.json.usage]);
  };
  const runQ = async (b, q) => q.stream ? rawStream(q, { 'x-api-key': KEY }, b) : post(b, '/v1/messages', q, { 'x-api-key': KEY });
  const expect = [];
  for (const q of mix) expect.push(keyOf(await runQ(base, q), q.stream));
  // the HTTP layer finding no memory to keep the request line cannot know the endpoint: its 500 is in
  // the server's default (OpenAI) shape
  const headless = j => j?.error?.message === 'out of memory' && j.error.type === 'server_error';
  const anthErr = (j, type) => j && j.type === 'error' && j.error?.type === type && typeof j.error.message === 'string';
  const oldEnv = process.env.M3_FAULT_ALLOC;
  process.env.M3_FAULT_ALLOC = 'server:200:30:397,engine:5:10:11,backend:300:10:150';
  try { faultSrv = await startServer(m3, ck, ['--served-model-name', 'tiny', '--api-key', KEY]); }
  finally { if (oldEnv === undefined) delete process.env.M3_FAULT_ALLOC; else process.env.M3_FAULT_ALLOC = oldEnv; }
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
        const last = x.events?.[x.events.length - 1];
        if (x.status === 200 && !x.bad.length && keyOf(x, true) === expect[i]) good++;
        // (the error event may be the first: message_start itself found no memory)
        else if (x.status === 200 && !x.bad.length && (x.events[0]?.event === 'message_start' || x.events.length === 1) &&
                 last?.event === 'error' && anthErr(last.data, 'api_error') && !x.events.some(e => e.event === 'message_stop')) clean++;
        else if (x.status === 500 && (anthErr(JSON.parse(x.text || 'null'), 'api_error') || headless(JSON.parse(x.text || 'null')))) clean++;
        else broken.push(`${i} stream: ${x.status} ${JSON.stringify((x.text || String(x.e)).slice(-400))}`);
      } else {
        if (x.status === 200 && keyOf(x, false) === expect[i]) good++;
        else if (x.status === 500 && (anthErr(x.json, 'api_error') || headless(x.json))) clean++;
        else broken.push(`${i}: ${x.status} ${(x.text || String(x.e)).slice(0, 300)}`);
      }
    });
    if (spent(await metrics(faultSrv.base))) break;
  }
  const fm = await metrics(faultSrv.base);
  const away = fm['m3_http_connections_turned_away_total'];
  ok(!broken.length && spent(fm) && clean > 0 && Number.isFinite(away) && closed <= away,
     `under injected allocation failures (${rounds + 1} rounds, ${fm['m3_fault_injected_total{module="server"}']} server / ${fm['m3_fault_injected_total{module="engine"}']} engine failures): ` +
     `${good} answers equal to the clean server's, ${clean} clean errors, ${closed} connections closed as accepted (${away} turned away), ${broken.length} broken` + (broken.length ? ':\n  ' + broken.slice(0, 4).join('\n  ') : ''));
  let after = 0;
  for (let i = 0; i < mix.length; i++) after += keyOf(await runQ(faultSrv.base, mix[i]), mix[i].stream) === expect[i];
  ok(after === mix.length, `after the failures: ${after}/${mix.length} answers equal to the clean server's`);

  // ---- metrics count these requests
  const mt0 = await metrics(base);
  const okMsg = await client.messages.create({ ...plain, max_tokens: 3 });
  await client.messages.countTokens({ model: 'tiny', messages: USER });
  try { await client.messages.create({ model: 'tiny', messages: USER }); } catch {}
  const mt1 = await metrics(base);
  const d = k => (mt1[k] || 0) - (mt0[k] || 0);
  ok(d('m3_http_responses_total{code="200"}') === 3 && d('m3_http_responses_total{code="400"}') === 1 &&
     d('m3_prompt_tokens_total') === okMsg.usage.input_tokens && d('m3_generation_tokens_total') === 3,
     `/metrics: +${d('m3_http_responses_total{code="200"}')} 200s (2 + the first /metrics), +${d('m3_http_responses_total{code="400"}')} 400, +${d('m3_prompt_tokens_total')} prompt tokens`);
  ok(/req \d+ POST \/v1\/messages 200/.test(srv.log) && /POST \/v1\/messages\/count_tokens 200/.test(srv.log), 'the log names the endpoints');
} catch (e) {
  ok(false, 'unexpected: ' + (e.stack || e));
} finally {
  if (nanSrv) await nanSrv.stop();
  if (faultSrv) { const fe = await faultSrv.stop(); ok(fe.code === 0, `the server with injected failures exits cleanly (${fe.code})`); }
  const st = await srv.stop();
  ok(st.code === 0, `server exits cleanly (${st.code})`);
}
console.log(`${R.failed ? 'FAILED' : 'PASSED'} (${R.failed} failures, ${((Date.now() - t0) / 1000).toFixed(1)} s)`);
process.exit(R.failed ? 1 : 0);
