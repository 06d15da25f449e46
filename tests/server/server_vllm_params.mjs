// vLLM's per-request extras through m3 serve (a make-tiny checkpoint with the qwen3 tokenizer):
//  - allowed_token_ids: sampled and greedy tokens (completions and chat, n 4) all among the ids;
//  - return_tokens_as_token_ids: logprobs name tokens "token_id:<id>" (completions' tokens and
//    top_logprobs keys, echo's prompt entries equal to the prompt's ids, chat's token / bytes /
//    top_logprobs, a stream), the ids decoding to the text;
//  - truncate_prompt_tokens: a prompt's last k tokens (usage, and the answer equal to the answer to
//    those k ids alone; echo gives their text; chat; -1: the model's length), bad values refused;
//  - continue_final_message: the prompt ends with the final message's text (no end of turn after
//    it); with add_generation_prompt true refused as vLLM refuses it; echo (chat): the last
//    message's content leads the answer's when it has the answer's role (n 2, streamed);
//  - cache_salt: the prefix cache is shared within a salt only (usage's cached_tokens);
//  - return_token_ids: prompt_token_ids and token_ids (completions per choice, chat at the top), the
//    stop token listed, streams adding up to the same; truncation_side; request_id naming the response;
//  - bad_words: none of a word's token sequences (alone, after a space) in greedy or sampled output;
//  - skip_special_tokens false: special tokens' text in the output; /tokenize's return_token_strs;
//  - /ping (GET, POST) and /invocations (SageMaker's: a chat completion or a completion by the body);
//  - thinking_token_budget: greedy, the plain answer's first B tokens then </mm:think> (the
//    reasoning their text, a stream the same), sampled and on completions too; nothing forced when
//    the prompt closed the reasoning; bad values refused; --reasoning-budget N as every request's
//    default;
//  - the extras not served are refused (400 naming the field) unless at the value that changes
//    nothing: priority (but under --scheduling-policy priority), use_beam_search, logits_processors,
//    documents, chat_template, kv_transfer_params; priority served under --scheduling-policy priority;
//  - chat_template under --trust-request-chat-template: the request's template renders the prompt
//    (with the model's special tokens; chat_template_kwargs.chat_template winning), its errors 400.
// Usage: node tests/server/server_vllm_params.mjs <m3-binary> <work-dir>
import fs from 'node:fs';
import { spawnSync } from 'node:child_process';
import { makeCheckpoint, startServer, post, stream, reporter } from './lib.mjs';

const [m3, work] = process.argv.slice(2);
if (!m3 || !work) { console.error('usage: node server_vllm_params.mjs <m3-binary> <work-dir>'); process.exit(2); }
const R = reporter(), ok = R.ok;
const ck = makeCheckpoint(m3, work + '/ck');
const srv = await startServer(m3, ck, ['--served-model-name', 'tiny', '--enable-prompt-tokens-details']);
const base = srv.base;
const idOf = t => (/^token_id:(\d+)$/.exec(t) || [])[1] !== undefined ? Number(/^token_id:(\d+)$/.exec(t)[1]) : -1;
const detok = async ids => (await post(base, '/detokenize', { tokens: ids })).json.prompt;
const prompt = Array.from({ length: 60 }, (_, i) => 1000 + ((i * 7919) % 20000));
const msgs = [{ role: 'user', content: 'Name three colours.' }];
try {
  // ---- allowed_token_ids ----
  const allowed = [1234, 5678, 9012, 13];
  for (const temperature of [1, 0]) {
    const r = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 16, temperature, n: temperature ? 4 : 1, seed: 7,
      logprobs: 0, return_tokens_as_token_ids: true, allowed_token_ids: allowed, ignore_eos: true });
    const ids = (r.json?.choices || []).flatMap(c => c.logprobs.tokens.map(idOf));
    ok(r.status === 200 && ids.length === (temperature ? 64 : 16) && ids.every(i => allowed.includes(i)),
       `allowed_token_ids (temperature ${temperature}): ${ids.length} tokens, all among ${JSON.stringify(allowed)}`);
  }
  const ca = await post(base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 12, temperature: 1, seed: 3, logprobs: true,
    return_tokens_as_token_ids: true, allowed_token_ids: allowed, chat_template_kwargs: { thinking_mode: 'disabled' } });
  const cids = (ca.json?.choices?.[0]?.logprobs?.content || []).map(x => idOf(x.token));
  ok(ca.status === 200 && cids.length > 0 && cids.every(i => allowed.includes(i)), `chat allowed_token_ids: ${cids.length} tokens, all allowed`);
  // (ids no token spells: tests/server/server_vocab.py, on a padded vocabulary)
  for (const [v, re, extra] of [[[], /empty/], [[5, 1 << 30], /index 1/], ['x', /array/],
                                [[1234], /min_tokens/, { min_tokens: 2, stop_token_ids: [1234] }]]) {
    const r = await post(base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 2, allowed_token_ids: v, ...extra });
    ok(r.status === 400 && r.json?.error?.param === 'allowed_token_ids' && re.test(r.json.error.message), `allowed_token_ids ${JSON.stringify(v)}: 400 (${r.json?.error?.message})`);
  }
  // a grammar that allows none of them: the request fails naming why, the server goes on
  const gx = await post(base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 4, allowed_token_ids: [1234], guided_choice: ['yes', 'no'] });
  ok(gx.status === 500 && /every token is masked/.test(gx.json?.error?.message), `allowed ids the grammar never takes: ${gx.status} (${gx.json?.error?.message})`);

  // ---- return_tokens_as_token_ids ----
  const plain = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 10, temperature: 0, logprobs: 3, ignore_eos: true });
  const named = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 10, temperature: 0, logprobs: 3, ignore_eos: true,
    return_tokens_as_token_ids: true });
  const NL = named.json.choices[0].logprobs, PL = plain.json.choices[0].logprobs;
  const gids = NL.tokens.map(idOf);
  ok(gids.every(i => i >= 0) && NL.top_logprobs.every(d => Object.keys(d).every(k => idOf(k) >= 0)) &&
     JSON.stringify(NL.token_logprobs) === JSON.stringify(PL.token_logprobs) && JSON.stringify(NL.text_offset) === JSON.stringify(PL.text_offset) &&
     named.json.choices[0].text === plain.json.choices[0].text && await detok(gids) === named.json.choices[0].text,
     `return_tokens_as_token_ids: ${gids.length} tokens named "token_id:<id>" (top_logprobs keys too), the same logprobs and offsets, the ids decode to the text`);
  const echo = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 1, temperature: 0, logprobs: 1, echo: true,
    return_tokens_as_token_ids: true });
  const EL = echo.json.choices[0].logprobs;
  ok(echo.status === 200 && JSON.stringify(EL.tokens.slice(0, prompt.length).map(idOf)) === JSON.stringify(prompt) && EL.token_logprobs[0] === null,
     'echo + logprobs: the prompt\'s entries are named by the prompt\'s own ids');
  const cn = await post(base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2,
    return_tokens_as_token_ids: true, chat_template_kwargs: { thinking_mode: 'disabled' } });
  const content = cn.json.choices[0].logprobs.content;
  ok(content.length > 0 && content.every(x => idOf(x.token) >= 0 && JSON.stringify(x.bytes) === JSON.stringify([...Buffer.from(x.token)]) &&
     x.top_logprobs.length === 2 && x.top_logprobs.every(y => idOf(y.token) >= 0)),
     `chat: ${content.length} entries named by id (bytes of the name, top_logprobs too)`);
  const st = await stream(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 10, temperature: 0, logprobs: 3, ignore_eos: true,
    return_tokens_as_token_ids: true });
  const stoks = st.events.flatMap(e => e.choices?.[0]?.logprobs?.tokens || []);
  ok(JSON.stringify(stoks) === JSON.stringify(NL.tokens), 'a stream names the same tokens');

  // ---- return_token_ids: the prompt's ids and the output's ----
  const p2 = prompt.slice(0, 25);
  const ri = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt, p2], n: 2, max_tokens: 9, temperature: 0.8, seed: 11,
    ignore_eos: true, return_token_ids: true });
  const rch = [...(ri.json?.choices || [])].sort((a, b) => a.index - b.index);
  let idsOk = rch.length === 4;
  for (const c of rch) {
    idsOk &&= JSON.stringify(c.prompt_token_ids) === JSON.stringify(c.index < 2 ? prompt : p2) && c.token_ids.length === 9 &&
               await detok(c.token_ids) === c.text;
  }
  ok(ri.status === 200 && idsOk, 'return_token_ids: each choice its prompt\'s ids and its 9 ids, which decode to its text (2 prompts x n 2)');
  const rs = await stream(base, '/v1/completions', { model: 'tiny', prompt: [prompt, p2], n: 2, max_tokens: 9, temperature: 0.8, seed: 11,
    ignore_eos: true, return_token_ids: true });
  const sIds = [[], [], [], []], sP = [0, 0, 0, 0];
  for (const ev of rs.events) for (const c of ev.choices || []) { sIds[c.index].push(...(c.token_ids || [])); if (c.prompt_token_ids) sP[c.index]++; }
  ok(rch.length === 4 && sIds.every((v, i) => JSON.stringify(v) === JSON.stringify(rch[i].token_ids)) && sP.every(x => x === 1),
     'a stream: the chunks\' token_ids add up to the same ids, each choice\'s prompt_token_ids once');
  const rstop = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 9, temperature: 0, return_token_ids: true,
    stop_token_ids: [77], logit_bias: { 77: 100 } });
  ok(rstop.json?.choices?.[0]?.finish_reason === 'stop' && JSON.stringify(rstop.json.choices[0].token_ids) === '[77]' && rstop.json.choices[0].text === '',
     'a stop token ends token_ids (vLLM lists it), not the text');
  const rc = await post(base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 7, temperature: 0, ignore_eos: true,
    return_token_ids: true, chat_template_kwargs: { thinking_mode: 'disabled' } });
  const mIds = (await post(base, '/tokenize', { model: 'tiny', messages: msgs, chat_template_kwargs: { thinking_mode: 'disabled' } })).json.tokens;
  ok(rc.status === 200 && JSON.stringify(rc.json.prompt_token_ids) === JSON.stringify(mIds) && rc.json.choices[0].token_ids.length === 7 &&
     await detok(rc.json.choices[0].token_ids) === rc.json.choices[0].message.content,
     'chat: prompt_token_ids (the rendered prompt\'s, as /tokenize gives them) and the choice\'s token_ids');
  const rcs = await stream(base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 7, temperature: 0, ignore_eos: true,
    return_token_ids: true, chat_template_kwargs: { thinking_mode: 'disabled' } });
  const csIds = rcs.events.flatMap(ev => (ev.choices || []).flatMap(c => c.token_ids || []));
  const csP = rcs.events.filter(ev => ev.prompt_token_ids);
  ok(JSON.stringify(csIds) === JSON.stringify(rc.json.choices[0].token_ids) && csP.length === 1 &&
     JSON.stringify(csP[0].prompt_token_ids) === JSON.stringify(mIds), 'a chat stream: the same ids, prompt_token_ids once at the top');

  // ---- request_id names the response ----
  const rq = await post(base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 2, request_id: 'job-42.a' });
  const rqc = await post(base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 2, request_id: 'job-42.b' });
  const rqs = await stream(base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 2, request_id: 'job-42.c' });
  ok(rq.json?.id === 'cmpl-job-42.a' && rqc.json?.id === 'chatcmpl-job-42.b' && rqs.events.length > 0 &&
     rqs.events.every(ev => ev.id === 'cmpl-job-42.c'), `request_id: ${rq.json?.id}, ${rqc.json?.id}, every chunk cmpl-job-42.c`);
  const xr = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json', 'X-Request-Id': 'hdr-9' },
    body: JSON.stringify({ model: 'tiny', prompt: 'hi', max_tokens: 2, request_id: 'body-9' }) });
  ok((await xr.json()).id === 'cmpl-hdr-9', 'an X-Request-Id header names the response before the body\'s request_id (as vLLM)');
  for (const v of ['has space', 'x'.repeat(65), '', 7]) {
    const r = await post(base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 2, request_id: v });
    ok(r.status === 400 && r.json?.error?.param === 'request_id', `request_id ${JSON.stringify(v).slice(0, 20)}: 400`);
  }

  // ---- truncate_prompt_tokens ----
  const k = 17;
  const tr = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 8, temperature: 0, ignore_eos: true, truncate_prompt_tokens: k });
  const tail = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt.slice(-k)], max_tokens: 8, temperature: 0, ignore_eos: true });
  ok(tr.status === 200 && tr.json.usage.prompt_tokens === k && tr.json.choices[0].text === tail.json.choices[0].text,
     `truncate_prompt_tokens ${k}: ${tr.json?.usage?.prompt_tokens} prompt tokens, the answer to the last ${k} ids alone`);
  const te = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 1, temperature: 0, echo: true, truncate_prompt_tokens: k });
  const tailText = await detok(prompt.slice(-k));
  ok(te.status === 200 && te.json.choices[0].text.startsWith(tailText), 'echo with truncation: the kept tokens\' text');
  const trr = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 8, temperature: 0, ignore_eos: true,
    truncate_prompt_tokens: k, truncation_side: 'right', return_token_ids: true });
  const head = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt.slice(0, k)], max_tokens: 8, temperature: 0, ignore_eos: true });
  ok(trr.status === 200 && JSON.stringify(trr.json.choices[0].prompt_token_ids) === JSON.stringify(prompt.slice(0, k)) &&
     trr.json.choices[0].text === head.json.choices[0].text, 'truncation_side right: the first k tokens');
  const tsb = await post(base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 2, truncation_side: 'middle' });
  ok(tsb.status === 400 && tsb.json?.error?.param === 'truncation_side', 'truncation_side "middle": 400');
  const tw = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 8, temperature: 0, ignore_eos: true, truncate_prompt_tokens: -1 });
  ok(tw.status === 200 && tw.json.usage.prompt_tokens === prompt.length, 'truncate_prompt_tokens -1: the whole prompt (it fits the model)');
  const tk = await post(base, '/tokenize', { model: 'tiny', messages: msgs });
  const chatIds = tk.json.tokens;
  const tc = await post(base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0, truncate_prompt_tokens: 5,
    chat_template_kwargs: { thinking_mode: 'disabled' } });
  ok(tc.status === 200 && tc.json.usage.prompt_tokens === 5 && chatIds.length > 5, `chat truncation: 5 of ${chatIds.length} prompt tokens`);
  const mml = tk.json.max_model_len;
  for (const [v, re] of [[0, /positive/], [-2, /positive/], ['3', /positive/], [mml + 1, /greater than max_model_len/]]) {
    const r = await post(base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 2, truncate_prompt_tokens: v });
    ok(r.status === 400 && r.json?.error?.param === 'truncate_prompt_tokens' && re.test(r.json.error.message), `truncate_prompt_tokens ${JSON.stringify(v)}: 400 (${r.json?.error?.message})`);
  }

  // ---- continue_final_message ----
  const pre = 'The three colours are red,';
  const cmsgs = [...msgs, { role: 'assistant', content: pre }];
  const cf = await post(base, '/tokenize', { model: 'tiny', messages: cmsgs, add_generation_prompt: false, continue_final_message: true });
  const cfText = cf.status === 200 ? await detok(cf.json.tokens) : '';
  const closed = await post(base, '/tokenize', { model: 'tiny', messages: cmsgs, add_generation_prompt: false });
  const closedText = await detok(closed.json.tokens);
  ok(cf.status === 200 && cfText.endsWith(pre) && closedText.startsWith(cfText) && closedText.length > cfText.length,
     `continue_final_message: the prompt ends with the final message's text (${cf.json?.count} tokens; closed, the turn goes on for ${closed.json.count - cf.json?.count} more)`);
  const cc = await post(base, '/v1/chat/completions', { model: 'tiny', messages: cmsgs, add_generation_prompt: false, continue_final_message: true,
    max_tokens: 6, temperature: 0, ignore_eos: true, chat_template_kwargs: { thinking_mode: 'disabled' } });
  ok(cc.status === 200 && cc.json.usage.prompt_tokens === cf.json.count, 'chat completions continue it (the same prompt)');
  // thinking on (the default): the prompt ends in the message's content, so the output is content
  const ct = await post(base, '/v1/chat/completions', { model: 'tiny', messages: cmsgs, add_generation_prompt: false, continue_final_message: true,
    max_tokens: 6, temperature: 0, ignore_eos: true });
  ok(ct.status === 200 && ct.json.choices[0].message.content.length > 0 && !ct.json.choices[0].message.reasoning_content,
     `with thinking on, the continued text is content (${JSON.stringify(ct.json?.choices?.[0]?.message?.content)})`);
  // echo (vLLM's, chat): the last message's content leads each choice's when it has the answer's role
  const ebody = { model: 'tiny', messages: cmsgs, add_generation_prompt: false, continue_final_message: true, max_tokens: 6, temperature: 0,
    ignore_eos: true, chat_template_kwargs: { thinking_mode: 'disabled' } };
  const ec = await post(base, '/v1/chat/completions', { ...ebody, echo: true, n: 2 });
  const es = await stream(base, '/v1/chat/completions', { ...ebody, echo: true });
  const esText = es.events.map(ev => ev.choices?.[0]?.delta?.content ?? '').join('');
  ok(ec.status === 200 && ec.json.choices.length === 2 && ec.json.choices.every(c => c.message.content === pre + cc.json.choices[0].message.content) &&
     ec.json.usage.completion_tokens === 2 * cc.json.usage.completion_tokens && esText === ec.json.choices[0].message.content,
     `echo with continue_final_message: the whole message (${JSON.stringify(ec.json?.choices?.[0]?.message?.content).slice(0, 50)}), n 2 and streamed too`);
  const eplain = { model: 'tiny', messages: msgs, max_tokens: 4, temperature: 0, ignore_eos: true, chat_template_kwargs: { thinking_mode: 'disabled' } };
  const e0 = (await post(base, '/v1/chat/completions', eplain)).json?.choices?.[0]?.message?.content;
  const e1 = (await post(base, '/v1/chat/completions', { ...eplain, echo: true })).json?.choices?.[0]?.message?.content;
  const e2m = (await post(base, '/v1/chat/completions', { ...eplain, add_generation_prompt: false, echo: true })).json?.choices?.[0]?.message;
  const e2 = e2m?.content;
  const e2s = await stream(base, '/v1/chat/completions', { ...eplain, add_generation_prompt: false, echo: true });
  ok(e2m?.role === 'user' && e2s.events[0]?.choices?.[0]?.delta?.role === 'user' && ec.json?.choices?.[0]?.message?.role === 'assistant' &&
     e2s.events.map(ev => ev.choices?.[0]?.delta?.content ?? '').join('') === e2,
     'without a generation prompt the answer has the last message\'s role (vLLM\'s): user here, streamed too; assistant after an assistant message');
  const e3 = (await post(base, '/v1/chat/completions', { ...eplain, echo: true, continue_final_message: true, add_generation_prompt: false,
    messages: [...msgs, { role: 'assistant', content: [{ type: 'text', text: 'Red' }, { type: 'text', text: 'and' }] }] })).json?.choices?.[0]?.message?.content;
  ok(typeof e0 === 'string' && e1 === e0 && typeof e2 === 'string' && e2.startsWith(msgs[0].content) && typeof e3 === 'string' && e3.startsWith('Red\nand'),
     'echo: nothing to echo when the last message is the user\'s under add_generation_prompt; its content without it; text parts joined by newlines');
  // a <mm:think> a user quoted in an earlier turn leaves the continuation in the content
  const quoted = await post(base, '/v1/chat/completions', { model: 'tiny', messages: [{ role: 'user', content: 'what is <mm:think> ?' },
    { role: 'assistant', content: 'It is' }], continue_final_message: true, max_tokens: 5, temperature: 0, ignore_eos: true });
  ok(quoted.status === 200 && quoted.json.choices[0].message.content.length > 0 && !quoted.json.choices[0].message.reasoning_content,
     'an unclosed <mm:think> quoted in an earlier turn: the continuation is still content');
  // Hugging Face's cut: the last place of the stripped text, then its trailing whitespace if the template kept it
  const hfCut = (r, f) => {
    const st = f.trim(), loc = r.lastIndexOf(st);
    if (loc < 0) return null;
    return r.slice(loc, loc + f.trimStart().length) === f ? r.slice(0, loc + f.trimStart().length) : r.slice(0, loc + st.length);
  };
  for (const fin of ['red, ', '  blue\n', 'red,', 'x\u3000']) {
    const m2 = [...msgs, { role: 'assistant', content: fin }];
    const closedR = await detok((await post(base, '/tokenize', { model: 'tiny', messages: m2, add_generation_prompt: false })).json.tokens);
    const got = await post(base, '/tokenize', { model: 'tiny', messages: m2, add_generation_prompt: false, continue_final_message: true });
    ok(got.status === 200 && await detok(got.json.tokens) === hfCut(closedR, fin), `continue_final_message ${JSON.stringify(fin)}: cut where apply_chat_template cuts`);
  }
  const tpl = await post(base, '/tokenize', { model: 'tiny', messages: msgs, chat_template: '{{ 1 }}' });
  ok(tpl.status === 400 && tpl.json?.error?.param === 'chat_template' && /--trust-request-chat-template/.test(tpl.json?.error?.message),
     `/tokenize with a chat_template, untrusted: 400 (${tpl.json?.error?.message})`);
  const both = await post(base, '/v1/chat/completions', { model: 'tiny', messages: cmsgs, add_generation_prompt: true, continue_final_message: true, max_tokens: 2 });
  ok(both.status === 400 && /Cannot set both/.test(both.json?.error?.message), `with add_generation_prompt true: 400 (${both.json?.error?.message})`);
  const dflt = await post(base, '/v1/chat/completions', { model: 'tiny', messages: cmsgs, continue_final_message: true, max_tokens: 2 });
  ok(dflt.status === 200, 'add_generation_prompt left out: continue_final_message alone is enough');
  const empty = await post(base, '/v1/chat/completions', { model: 'tiny', messages: [...msgs, { role: 'assistant', content: null }], continue_final_message: true, max_tokens: 2 });
  ok(empty.status === 400 && empty.json?.error?.param === 'continue_final_message', `a final message without text: 400 (${empty.json?.error?.message})`);

  // ---- cache_salt: the prefix cache shared within a salt ----
  const longP = Array.from({ length: 300 }, (_, i) => 2000 + ((i * 104729) % 30000));
  const cached = async salt => {
    const r = await post(base, '/v1/completions', { model: 'tiny', prompt: [longP], max_tokens: 1, temperature: 0, ...(salt === undefined ? {} : { cache_salt: salt }) });
    return r.status === 200 ? r.json.usage.prompt_tokens_details?.cached_tokens ?? 0 : -1;
  };
  const a1 = await cached('alice'), a2 = await cached('alice'), b1 = await cached('bob'), n1 = await cached(undefined), n2 = await cached(undefined),
        a3 = await cached('alice');
  ok(a1 === 0 && a2 > 0 && b1 === 0 && n1 === 0 && n2 > 0 && a3 > 0,
     `cache_salt: alice ${a1} then ${a2} cached tokens, bob ${b1}, no salt ${n1} then ${n2}, alice again ${a3}`);
  for (const v of ['', 5]) {
    const r = await post(base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 2, cache_salt: v });
    ok(r.status === 400 && r.json?.error?.param === 'cache_salt', `cache_salt ${JSON.stringify(v)}: 400`);
  }

  // ---- bad_words: no sequence of theirs in the output ----
  const tokz = async t => (await post(base, '/tokenize', { model: 'tiny', prompt: t })).json.tokens;
  const seqsOf = async w => { // vLLM's rule: the word (leading space stripped) alone, and after a space when that starts otherwise with as many tokens
    const a = await tokz(w.trimStart()), b = await tokz(' ' + w.trimStart());
    return b.length === a.length && b[0] !== a[0] ? [a, b] : [a];
  };
  const has = (ids, q) => ids.some((_, i) => q.every((t, j) => ids[i + j] === t));
  const free = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 24, temperature: 0, ignore_eos: true, return_token_ids: true });
  const fids = free.json.choices[0].token_ids;
  let word = null, seqs = null;
  for (let i = 2; i + 2 <= fids.length && !word; i++) { // a two-token stretch of the free output that tokenizes back to itself
    const w = await detok(fids.slice(i, i + 2));
    const q = await seqsOf(w);
    if (q.some(x => x.length === 2 && has(fids, x)) && w.trim()) { word = w; seqs = q; }
  }
  const one = await detok([fids[0]]), oneSeqs = await seqsOf(one);
  const bw = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 24, temperature: 0, ignore_eos: true, return_token_ids: true,
    bad_words: word ? [one, word] : [one] });
  const bids = bw.json?.choices?.[0]?.token_ids || [];
  ok(bw.status === 200 && word !== null && bids.length === 24 && ![...oneSeqs, ...seqs].some(q => has(bids, q)) && JSON.stringify(bids) !== JSON.stringify(fids),
     `bad_words [${JSON.stringify(one)}, ${JSON.stringify(word)}]: the free output holds them, this one none of their ${oneSeqs.length + (seqs ? seqs.length : 0)} sequences`);
  const bws = await post(base, '/v1/completions', { model: 'tiny', prompt: [prompt], max_tokens: 24, temperature: 0.9, seed: 4, n: 3, ignore_eos: true,
    return_token_ids: true, bad_words: word ? [one, word] : [one] });
  ok(bws.status === 200 && bws.json.choices.every(c => ![...oneSeqs, ...(seqs || [])].some(q => has(c.token_ids, q))), 'sampled (n 3): none either');
  for (const [v, re] of [['red', /array of strings/], [[5], /not a string/], [['  '], /empty/], [Array(129).fill('a'), /limit/]]) {
    const r = await post(base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 2, bad_words: v });
    ok(r.status === 400 && r.json?.error?.param === 'bad_words' && re.test(r.json.error.message), `bad_words ${JSON.stringify(v).slice(0, 24)}: 400 (${r.json?.error?.message})`);
  }

  // ---- /tokenize's return_token_strs: the tokens as the vocabulary spells them ----
  const vocab = JSON.parse(fs.readFileSync(ck + '/tokenizer.json')).model.vocab, spell = {};
  for (const [k3, id] of Object.entries(vocab)) spell[id] = k3;
  const tsr = await post(base, '/tokenize', { model: 'tiny', prompt: 'Hello world, colours', return_token_strs: true });
  ok(tsr.status === 200 && tsr.json.token_strs.length === tsr.json.count && tsr.json.count > 1 &&
     tsr.json.tokens.every((id, i) => tsr.json.token_strs[i] === spell[id]), `/tokenize return_token_strs: ${JSON.stringify(tsr.json?.token_strs)}`);
  const tsb2 = await post(base, '/tokenize', { model: 'tiny', prompt: 'x', return_token_strs: 1 });
  ok(tsb2.status === 400 && tsb2.json?.error?.param === 'return_token_strs', 'return_token_strs 1: 400');

  // ---- vLLM's /ping (SageMaker's health check): GET and POST ----
  const pg = await fetch(base + '/ping'), pp = await fetch(base + '/ping', { method: 'POST' }), pd = await fetch(base + '/ping', { method: 'DELETE' });
  ok(pg.status === 200 && pp.status === 200 && pd.status === 405, `/ping: GET ${pg.status}, POST ${pp.status}, DELETE ${pd.status}`);
  // ... and its /invocations: a chat completion or a completion, by the body
  const ivc = { model: 'tiny', messages: msgs, max_tokens: 5, temperature: 0 }, ivp = { model: 'tiny', prompt: 'hi', max_tokens: 5, temperature: 0 };
  const [ic, oc, ip, op, ie, ig] = [await post(base, '/invocations', ivc), await post(base, '/v1/chat/completions', ivc),
    await post(base, '/invocations', ivp), await post(base, '/v1/completions', ivp), await post(base, '/invocations', { model: 'tiny' }),
    await fetch(base + '/invocations')];
  ok(ic.json?.object === 'chat.completion' && ic.json.choices[0].message.content === oc.json?.choices?.[0]?.message?.content &&
     ip.json?.object === 'text_completion' && ip.json.choices[0].text === op.json?.choices?.[0]?.text && ie.status === 400 &&
     /messages.*prompt/.test(ie.json?.error?.message) && ig.status === 405,
     `/invocations: messages -> chat completion, prompt -> completion (the same answers), neither: 400, GET: ${ig.status}`);
  const ist = await stream(base, '/invocations', { ...ivc, stream: true });
  ok(ist.done && ist.events.every(ev => ev.object === 'chat.completion.chunk') &&
     ist.events.map(ev => ev.choices?.[0]?.delta?.content ?? '').join('') === oc.json?.choices?.[0]?.message?.content,
     '/invocations streams as its endpoint does (the same text)');

  // ---- thinking_token_budget: the reasoning closes after that many tokens ----
  const tagId = async t => { const r = (await post(base, '/tokenize', { model: 'tiny', prompt: t })).json?.tokens; return r?.length === 1 ? r[0] : -1; };
  const OPEN = await tagId('<mm:think>'), CLOSE = await tagId('</mm:think>');
  ok(OPEN >= 0 && CLOSE >= 0, `the reasoning tags are single tokens (${OPEN}, ${CLOSE})`);
  const tb = { model: 'tiny', messages: msgs, max_tokens: 16, temperature: 0, ignore_eos: true, return_token_ids: true };
  const tfree = (await post(base, '/v1/chat/completions', tb)).json; // thinking on (the template's default)
  const F = tfree?.choices?.[0]?.token_ids ?? [], nat = F.indexOf(CLOSE); // where the model closes it alone (-1: not in 16)
  for (const B of [0, 5, 40]) {
    const r = (await post(base, '/v1/chat/completions', { ...tb, thinking_token_budget: B })).json;
    const T = r?.choices?.[0]?.token_ids ?? [], m = r?.choices?.[0]?.message;
    const want = (nat >= 0 && nat <= B) || B >= 16 ? F : [...F.slice(0, B), CLOSE]; // then free again
    ok(T.length === 16 && JSON.stringify(T.slice(0, want.length)) === JSON.stringify(want.slice(0, 16)) &&
       (m?.reasoning_content ?? '') === (B >= 16 ? tfree.choices[0].message.reasoning_content ?? '' : await detok(T.slice(0, Math.min(B, T.indexOf(CLOSE))))),
       `thinking_token_budget ${B}: ${B < 16 ? `the plain answer's first ${B} tokens, then </mm:think>` : 'the plain answer'}; its reasoning those tokens' text (${JSON.stringify(m?.reasoning_content ?? '').slice(0, 40)})`);
    if (B === 5) {
      const st = await stream(base, '/v1/chat/completions', { ...tb, thinking_token_budget: B });
      const rs = st.events.map(ev => ev.choices?.[0]?.delta?.reasoning_content ?? '').join(''), cs = st.events.map(ev => ev.choices?.[0]?.delta?.content ?? '').join('');
      ok(rs === (m?.reasoning_content ?? '') && cs === (m?.content ?? ''), 'thinking_token_budget 5, streamed: the same reasoning and content');
    }
  }
  const tbs = (await post(base, '/v1/chat/completions', { ...tb, temperature: 1, seed: 5, thinking_token_budget: 3 })).json?.choices?.[0]?.token_ids ?? [];
  ok(tbs.indexOf(CLOSE) === 3, `sampled, budget 3: the reasoning closes at the 4th token (at ${tbs.indexOf(CLOSE)})`);
  // a grammar constraining the row decides (nothing forced against it); its start after </mm:think> is the forced close
  const tg1 = await post(base, '/v1/completions', { model: 'tiny', prompt: [...prompt, OPEN], max_tokens: 8, temperature: 0, guided_regex: '[a-z]{8}',
    thinking_token_budget: 2 });
  ok(tg1.status === 200 && /^[a-z]{8}$/.test(tg1.json?.choices?.[0]?.text), `completions, a regex from the first token, budget 2: the regex's text (${JSON.stringify(tg1.json?.choices?.[0]?.text ?? tg1.json?.error?.message)})`);
  const tg2 = await post(base, '/v1/chat/completions', { ...tb, max_tokens: 12, response_format: { type: 'json_object' }, thinking_token_budget: 3 });
  ok(tg2.status === 200 && tg2.json.choices[0].token_ids[3] === CLOSE && tg2.json.choices[0].token_ids.slice(0, 3).every(t => t !== CLOSE),
     `chat, thinking on, json_object, budget 3: the reasoning closes at the 4th token, then the constrained answer (${tg2.json?.error?.message ?? 'ok'})`);
  // a <mm:think> quoted in an earlier turn opens nothing (adaptive thinking: the final turn has no tag)
  const qmsgs = [{ role: 'user', content: 'what does <mm:think> mean?' }];
  const qa = { ...tb, messages: qmsgs, chat_template_kwargs: { thinking_mode: 'adaptive' } };
  const q0 = (await post(base, '/v1/chat/completions', qa)).json?.choices?.[0]?.token_ids;
  const q1 = (await post(base, '/v1/chat/completions', { ...qa, thinking_token_budget: 0 })).json?.choices?.[0]?.token_ids;
  const q2 = await post(base, '/v1/chat/completions', { ...qa, thinking_token_budget: 3, response_format: { type: 'json_object' } });
  const qo = q0 ? q0.indexOf(OPEN) : -1; // the model's own open tag (budget 0: the close right after it)
  ok(q0 && q1 && (qo < 0 ? JSON.stringify(q0) === JSON.stringify(q1)
                         : JSON.stringify(q1.slice(0, qo + 2)) === JSON.stringify([...q0.slice(0, qo + 1), CLOSE])) && q2.status === 200,
     `a <mm:think> quoted by the user, adaptive thinking: budget 0 forces nothing${qo < 0 ? '' : ' before the model opens its own'} (and with json_object: 200)`);
  const tcb = (await post(base, '/v1/completions', { model: 'tiny', prompt: [...prompt, OPEN], max_tokens: 6, temperature: 0, ignore_eos: true,
    return_token_ids: true, thinking_token_budget: 2 })).json?.choices?.[0]?.token_ids ?? [];
  ok(tcb[2] === CLOSE && !tcb.slice(0, 2).includes(CLOSE), `completions, a prompt ending in <mm:think>, budget 2: ${JSON.stringify(tcb)}`);
  const toff = { ...tb, chat_template_kwargs: { thinking_mode: 'disabled' } };
  const to1 = (await post(base, '/v1/chat/completions', toff)).json?.choices?.[0]?.token_ids;
  const to2 = (await post(base, '/v1/chat/completions', { ...toff, thinking_token_budget: 0 })).json?.choices?.[0]?.token_ids;
  ok(to1 && JSON.stringify(to1) === JSON.stringify(to2), 'thinking disabled (the prompt closed the reasoning): budget 0 changes nothing');
  for (const v of [-2, '5', 2.5]) {
    const r = await post(base, '/v1/chat/completions', { ...tb, thinking_token_budget: v });
    ok(r.status === 400 && r.json?.error?.param === 'thinking_token_budget', `thinking_token_budget ${JSON.stringify(v)}: 400 (${r.json?.error?.message})`);
  }
  // --reasoning-budget N (llama.cpp's flag): the budget of requests that give none
  const rbs = await startServer(m3, ck, ['--served-model-name', 'tiny', '--reasoning-budget', '3']);
  const rbDef = (await post(rbs.base, '/v1/chat/completions', tb)).json?.choices?.[0]?.token_ids ?? [];
  const rbOwn = (await post(rbs.base, '/v1/chat/completions', { ...tb, thinking_token_budget: 5 })).json?.choices?.[0]?.token_ids ?? [];
  const rbNone = (await post(rbs.base, '/v1/chat/completions', { ...tb, thinking_token_budget: -1 })).json?.choices?.[0]?.token_ids ?? [];
  const rbCmpl = (await post(rbs.base, '/v1/completions', { model: 'tiny', prompt: [...prompt, OPEN], max_tokens: 6, temperature: 0, ignore_eos: true,
    return_token_ids: true })).json?.choices?.[0]?.token_ids ?? [];
  ok(JSON.stringify(rbDef.slice(0, 4)) === JSON.stringify([...F.slice(0, 3), CLOSE]) && rbOwn[5] === CLOSE && !rbOwn.slice(0, 5).includes(CLOSE) &&
     JSON.stringify(rbNone) === JSON.stringify(F) && rbCmpl.length === 6 && rbCmpl[3] !== CLOSE,
     `--reasoning-budget 3: chat closed after 3 tokens (at ${rbDef.indexOf(CLOSE)}); a request's own budget 5 wins (at ${rbOwn.indexOf(CLOSE)}), -1 none; completions untouched`);
  ok((await rbs.stop()).code === 0, 'the --reasoning-budget server stopped cleanly');
  const rbBad = spawnSync(m3, ['serve', '-m', ck, '--reasoning-budget', '-2'], { encoding: 'utf8' });
  ok(rbBad.status === 2 && /--reasoning-budget/.test(rbBad.stderr), `--reasoning-budget -2: exit ${rbBad.status}`);

  // ---- the extras not served: refused unless they change nothing ----
  // skip_special_tokens false: a special token's text stays (]~!b[ made certain by logit_bias)
  const sp = async (skip, stream_) => {
    const body = { model: 'tiny', prompt: 'hi', max_tokens: 3, temperature: 0, ignore_eos: true, logit_bias: { 151669: 100 }, skip_special_tokens: skip };
    if (!stream_) return (await post(base, '/v1/completions', body)).json?.choices?.[0]?.text;
    return (await stream(base, '/v1/completions', body)).events.map(ev => ev.choices?.[0]?.text || '').join('');
  };
  ok(await sp(true, false) === '' && await sp(false, false) === ']~!b['.repeat(3) && await sp(false, true) === ']~!b['.repeat(3),
     'skip_special_tokens: true leaves the special token\'s text out, false keeps it (stream too)');
  const refused = [['priority', 1], ['use_beam_search', true],
                   ['logits_processors', ['x']], ['documents', [{ title: 'a', text: 'b' }]], ['chat_template', '{{ 1 }}'],
                   ['kv_transfer_params', { a: 1 }]];
  for (const [k2, v] of refused) {
    const r = await post(base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 2, [k2]: v });
    ok(r.status === 400 && r.json?.error?.param === k2, `${k2}: ${JSON.stringify(v)}: 400 (${r.json?.error?.message})`);
  }
  const accepted = [['bad_words', []], ['skip_special_tokens', true], ['priority', 0], ['use_beam_search', false],
                    ['spaces_between_special_tokens', false], ['add_special_tokens', true], ['kv_transfer_params', {}], ['documents', null]];
  for (const [k2, v] of accepted) {
    const r = await post(base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 2, [k2]: v });
    ok(r.status === 200, `${k2}: ${JSON.stringify(v)} changes nothing: 200`);
  }

  // ---- --scheduling-policy priority: the request's priority is taken ----
  const ps = await startServer(m3, ck, ['--served-model-name', 'tiny', '--scheduling-policy', 'priority', '--max-num-seqs', '1']);
  const pr = await Promise.all([7, -3, 0].map(p => post(ps.base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 3, priority: p })));
  const pbad = await post(ps.base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 3, priority: 2 ** 40 });
  ok(pr.every(r => r.status === 200) && pbad.status === 400 && pbad.json?.error?.param === 'priority',
     '--scheduling-policy priority: priorities 7, -3, 0 served; 2^40: 400');
  ok((await ps.stop()).code === 0, 'the priority server stopped cleanly');
  // ---- --trust-request-chat-template: a request's own template renders its prompt ----
  {
    const ts = await startServer(m3, ck, ['--served-model-name', 'tiny', '--trust-request-chat-template']);
    const own = '{{ bos_token }}<{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}>{{ eos_token }}{% if add_generation_prompt %}A:{% endif %}';
    const want = (await post(ts.base, '/tokenize', { model: 'tiny', prompt: ']~!b[<user: Name three colours.>[e~[A:' })).json?.tokens;
    const got = await post(ts.base, '/tokenize', { model: 'tiny', messages: msgs, chat_template: own });
    ok(got.status === 200 && want?.length > 5 && JSON.stringify(got.json.tokens) === JSON.stringify(want),
       'trusted: /tokenize renders the request\'s template with the model\'s bos_token / eos_token');
    const viaKw = await post(ts.base, '/tokenize', { model: 'tiny', messages: msgs, chat_template: 'x', chat_template_kwargs: { chat_template: own } });
    ok(viaKw.status === 200 && JSON.stringify(viaKw.json.tokens) === JSON.stringify(want), 'trusted: chat_template_kwargs.chat_template wins');
    const tc = await post(ts.base, '/v1/chat/completions', { model: 'tiny', messages: msgs, chat_template: own, max_tokens: 3, temperature: 0 });
    ok(tc.status === 200 && tc.json?.usage?.prompt_tokens === want?.length, `trusted: a chat completion of the template's prompt (${tc.json?.usage?.prompt_tokens} prompt tokens)`);
    const plain = await post(ts.base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 3, temperature: 0 });
    const plainRef = await post(base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 3, temperature: 0 });
    ok(plain.status === 200 && plain.json?.usage?.prompt_tokens === plainRef.json?.usage?.prompt_tokens &&
       plain.json?.choices?.[0]?.message?.content === plainRef.json?.choices?.[0]?.message?.content, 'trusted: without a template, the model\'s');
    for (const [body, param, re] of [[{ chat_template: '{% if %}' }, 'chat_template', /chat_template/],
                                     [{ chat_template: "{{ raise_exception('no tools here') }}" }, 'chat_template', /no tools here/],
                                     [{ chat_template: "{{ raise_exception('out of memory') }}" }, 'chat_template', /raise_exception: out of memory/],
                                     [{ chat_template: 7 }, 'chat_template', /must be a string/]]) {
      const r = await post(ts.base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 2, ...body });
      ok(r.status === 400 && r.json?.error?.param === param && re.test(r.json?.error?.message), `trusted, ${JSON.stringify(body)}: 400 (${r.json?.error?.message})`);
    }
    const tcomp = await post(ts.base, '/v1/completions', { model: 'tiny', prompt: 'hi', max_tokens: 2, chat_template: own });
    ok(tcomp.status === 400 && tcomp.json?.error?.param === 'chat_template', 'trusted: a completion with a chat_template still 400');
    ok((await ts.stop()).code === 0, 'the trusting server stopped cleanly');
  }
  const lifo = spawnSync(m3, ['serve', '-m', ck, '--scheduling-policy', 'lifo'], { encoding: 'utf8' });
  ok(lifo.status === 2 && /expected fcfs or priority/.test(lifo.stderr), `--scheduling-policy lifo: exit ${lifo.status}`);
} catch (e) {
  ok(false, 'exception: ' + (e.stack || e));
}
const stop = await srv.stop();
ok(stop.code === 0, `server stopped cleanly (${stop.code ?? stop.signal})`);
console.log(R.failed ? `server_vllm_params: ${R.failed} checks failed` : 'server_vllm_params: all checks passed');
process.exit(R.failed ? 1 : 0);
