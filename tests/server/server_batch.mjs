// vLLM's batch runner and Unix-socket serving (a make-tiny checkpoint with the qwen3 tokenizer):
//  - m3 serve --uds PATH: answers over the socket as over TCP (the same greedy answer); a second
//    server on a live socket is refused, a stale socket replaced, a path that is not a socket
//    left alone and refused; the socket is gone after SIGTERM;
//  - m3 run-batch -i IN -o OUT: every non-blank input line answered in the input's order; each
//    request's body the answer m3 serve gives over TCP to the same body (chat, completions,
//    responses; greedy, seeded samples, n 2); the lines that are not requests (not JSON, an array,
//    no custom_id, GET, another url, a stream, no body) refused naming their line; a request the
//    server refuses keeps its status and error object; --api-key; standard input and output;
//    empty input; a run that fails before answering leaves OUT as it was; bad flags and paths
//    refused before the model loads; SIGTERM mid-run: the answers in order up to the first
//    missing, and a count of the rest.
// Usage: node tests/server/server_batch.mjs <m3-binary> <work-dir>
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import { makeCheckpoint, startServer, post, reporter } from './lib.mjs';

const [m3, work] = process.argv.slice(2);
if (!m3 || !work) { console.error('usage: node server_batch.mjs <m3-binary> <work-dir>'); process.exit(2); }
const R = reporter(), ok = R.ok;
const ck = makeCheckpoint(m3, work + '/ck');
const extra = (process.env.M3_SERVE_ARGS || '').split(/\s+/).filter(Boolean);
const srv = await startServer(m3, ck, ['--served-model-name', 'tiny']);

// a request over a Unix socket: {status, json}
function udsReq(sock, method, route, body) {
  return new Promise((res, rej) => {
    const data = body === undefined ? undefined : JSON.stringify(body);
    const rq = http.request({ socketPath: sock, method, path: route, headers: data ? { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) } : {} }, r => {
      let t = '';
      r.setEncoding('utf8');
      r.on('data', d => { t += d; });
      r.on('end', () => { let json = null; try { json = JSON.parse(t); } catch {} res({ status: r.statusCode, json, text: t }); });
    });
    rq.on('error', rej);
    if (data) rq.write(data);
    rq.end();
  });
}
// starts m3 serve on a Unix socket; resolves once /health answers there, or with the exit of a refusal
async function udsServer(sock, args = []) {
  const proc = spawn(m3, ['serve', '-m', ck, '--uds', sock, ...extra, ...args], { stdio: ['ignore', 'inherit', 'pipe'] });
  const s = { proc, log: '' };
  proc.stderr.on('data', d => { s.log += d; });
  s.exited = new Promise(r => proc.on('exit', (code, signal) => r({ code, signal })));
  let gone = false;
  s.exited.then(() => { gone = true; });
  const t0 = Date.now();
  while (!gone) {
    if (Date.now() - t0 > 120000) { proc.kill('SIGKILL'); throw new Error('--uds server did not start:\n' + s.log); }
    try { if ((await udsReq(sock, 'GET', '/health')).status === 200) return s; } catch {}
    await new Promise(r => setTimeout(r, 50));
  }
  return s;
}
// runs m3 run-batch: {code, stdout, stderr}
function runBatch(args, input) { // (a hang fails the test: 5 minutes)
  const r = spawnSync(m3, ['run-batch', ...args, ...extra], { input, encoding: 'utf8', maxBuffer: 64 << 20, timeout: 300000 });
  // a sanitizer's report goes to the runner's stderr, which the checks do not show: shown here
  if (/(Thread|Address|UndefinedBehavior|Leak)Sanitizer/.test(r.stderr || '')) console.log(`run-batch ${args.join(' ')}:\n${r.stderr}`);
  return { code: r.status, stdout: r.stdout, stderr: r.stderr + (r.error ? `\n(${r.error.message})` : '') };
}
// a child's exit, or null when it has not exited after ms (it is then killed)
function exitWithin(proc, ms) {
  return new Promise(res => {
    const t = setTimeout(() => { proc.kill('SIGKILL'); res(null); }, ms);
    proc.on('exit', (code, signal) => { clearTimeout(t); res({ code, signal }); });
  });
}
const lines = f => fs.readFileSync(f, 'utf8').split('\n').filter(Boolean).map(l => JSON.parse(l));
// what must agree between two answers to one body (ids and times differ)
function gist(url, j) {
  if (!j) return null;
  if (url === '/v1/responses') return { status: j.status, output: j.output?.map(o => ({ type: o.type, content: o.content?.map(c => c.text), summary: o.summary })), usage: j.usage };
  return { choices: j.choices?.map(c => ({ text: c.text, message: c.message && { role: c.message.role, content: c.message.content, reasoning: c.message.reasoning_content ?? c.message.reasoning }, finish: c.finish_reason })), usage: j.usage };
}

try {
  // ---------------------------------------------------------------- --uds
  const sock = path.join(work, 's.sock');
  fs.rmSync(sock, { force: true });
  const us = await udsServer(sock, ['--served-model-name', 'tiny']);
  const body = { model: 'tiny', prompt: 'The quick brown fox', max_tokens: 12, temperature: 0, ignore_eos: true };
  const [viaU, viaT] = [await udsReq(sock, 'POST', '/v1/completions', body), await post(srv.base, '/v1/completions', body)];
  ok(viaU.status === 200 && viaT.status === 200 && viaU.json.choices[0].text === viaT.json.choices[0].text && viaU.json.usage.completion_tokens === 12,
     `--uds: a completion over the socket equals the TCP server's (${JSON.stringify(viaU.json?.choices?.[0]?.text)})`);
  ok(/listening on unix:/.test(us.log), '--uds: the log names the socket');
  const second = await udsServer(sock, []);
  const se = await second.exited;
  ok(se.code === 1 && /a server is listening there/.test(second.log), `--uds on a live socket: refused (exit ${se.code}): ${second.log.trim().split('\n').pop()}`);
  ok((await udsReq(sock, 'GET', '/health')).status === 200, '--uds: the first server still answers');
  us.proc.kill('SIGTERM');
  const ue = await us.exited;
  ok(ue.code === 0 && !fs.existsSync(sock), `--uds: SIGTERM: exit ${ue.code}, the socket removed`);
  // a stale socket (bound, never listening, its process gone) is replaced
  execFileSync('python3', ['-c', 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])', sock]);
  ok(fs.statSync(sock).isSocket(), '(a stale socket made)');
  const st = await udsServer(sock, []);
  ok(st.proc.exitCode === null && (await udsReq(sock, 'GET', '/health')).status === 200, '--uds: a stale socket is replaced');
  st.proc.kill('SIGTERM');
  await st.exited;
  fs.writeFileSync(sock, 'not a socket\n');
  const nf = await udsServer(sock, []);
  const ne = await nf.exited;
  ok(ne.code === 1 && /exists and is not a socket/.test(nf.log) && fs.readFileSync(sock, 'utf8') === 'not a socket\n',
     `--uds on a regular file: refused (exit ${ne.code}), the file kept`);
  fs.rmSync(sock);

  // ---------------------------------------------------------------- run-batch
  const reqs = [];
  const chat = (content, o = {}) => ({ model: 'tiny', messages: [{ role: 'user', content }], temperature: 0, chat_template_kwargs: { thinking_mode: 'disabled' }, ...o });
  for (let i = 0; i < 8; i++) reqs.push({ url: '/v1/chat/completions', body: chat(`Question ${i}: name a colour.`, { max_tokens: 3 + 3 * (7 - i) }) });
  for (let i = 0; i < 8; i++) reqs.push({ url: '/v1/completions', body: { model: 'tiny', prompt: `Story ${i}:`, max_tokens: 2 + 4 * ((i * 5) % 8), temperature: 0, ignore_eos: true } });
  reqs.push({ url: '/v1/completions', body: { model: 'tiny', prompt: 'Seeded', max_tokens: 10, temperature: 1, seed: 11, n: 2 } });
  reqs.push({ url: '/v1/chat/completions', body: chat('Seeded chat', { temperature: 0.8, seed: 5, max_tokens: 9 }) });
  reqs.push({ url: '/v1/responses', body: { model: 'tiny', input: 'Say hi', max_output_tokens: 6, temperature: 0 } });
  reqs.push({ url: '/v1/chat/completions', body: chat('With thinking', { max_tokens: 14, chat_template_kwargs: {} }) });
  // a body nested 1,500 deep (an unknown field: ignored by the server) and a duplicate key (the last one taken)
  reqs.push({ url: '/v1/completions', body: { model: 'tiny', prompt: 'Deep', max_tokens: 3, temperature: 0 },
    raw: i => `{"custom_id": "r${i}", "method": "POST", "url": "/v1/completions", "body": {"model": "tiny", "prompt": "Deep", ` +
      `"max_tokens": 9, "max_tokens": 3, "temperature": 0, "x_deep": ${'['.repeat(1500)}${']'.repeat(1500)}}}` });
  const want = [];
  for (const r of reqs) want.push(await post(srv.base, r.url, r.raw ? r.raw(reqs.indexOf(r)).replace(/^.*"body": /, '').slice(0, -1) : r.body));
  ok(want.every(w => w.status === 200), `the TCP server answers the ${reqs.length} requests (200)`);
  // the input: requests as batch lines, with lines that are not requests among them
  const bad = [
    ['not json at all', null, /input line \d+: not valid JSON/],
    ['[1, 2]', null, /input line \d+: a request is a JSON object, not an array/],
    [JSON.stringify({ method: 'POST', url: '/v1/completions', body: {} }), null, /"custom_id": a string is required/],
    [JSON.stringify({ custom_id: 'x-get', method: 'GET', url: '/v1/completions', body: {} }), 'x-get', /only "POST"/],
    [JSON.stringify({ custom_id: 'x-emb', method: 'POST', url: '/v1/embeddings', body: { input: 'a' } }), 'x-emb', /'\/v1\/embeddings': supported endpoints are/],
    [JSON.stringify({ custom_id: 'x-stream', method: 'POST', url: '/v1/completions', body: { prompt: 'a', stream: true } }), 'x-stream', /"stream" must be false/],
    [JSON.stringify({ custom_id: 'x-nobody', method: 'POST', url: '/v1/completions' }), 'x-nobody', /"body": the request's JSON object is required/],
  ];
  const input = [], expect = [];
  reqs.forEach((r, i) => {
    input.push(r.raw ? r.raw(i) : JSON.stringify({ custom_id: `r${i}`, method: 'POST', url: r.url, body: r.body }));
    expect.push({ cid: `r${i}`, i });
    if (i % 3 === 1 && bad.length) { const b = bad.shift(); input.push(b[0]); expect.push({ cid: b[1], re: b[2], line: input.length }); }
    if (i === 4) input.push('   ');
  });
  input.push(JSON.stringify({ custom_id: 'x-server', method: 'POST', url: '/v1/completions', body: { model: 'tiny', prompt: 'a', max_tokens: -3 } }));
  expect.push({ cid: 'x-server', server: true });
  const inF = path.join(work, 'in.jsonl'), outF = path.join(work, 'out.jsonl');
  fs.writeFileSync(inF, input.join('\n') + '\n\n');
  const rb = runBatch(['-i', inF, '-o', outF, '-m', ck, '--served-model-name', 'tiny', '--max-num-seqs', '2', '--disable-log-requests']);
  ok(rb.code === 0 && /requests answered \(\d+ ok, \d+ refused\)/.test(rb.stderr), `run-batch: exit ${rb.code}: ${rb.stderr.trim().split('\n').pop()}`);
  const got = fs.existsSync(outF) ? lines(outF) : [];
  ok(got.length === expect.length, `run-batch: ${got.length} output lines for ${expect.length} requests (blank lines skipped)`);
  ok(got.every((g, k) => g.custom_id === expect[k]?.cid), 'run-batch: the answers in the input\'s order (custom_id)');
  let same = 0, refused = 0;
  got.forEach((g, k) => {
    const e = expect[k];
    if (!e) return;
    if (e.i !== undefined) {
      const w = want[e.i], url = reqs[e.i].url;
      const eq = g.response?.status_code === 200 && g.error === null && JSON.stringify(gist(url, g.response.body)) === JSON.stringify(gist(url, w.json));
      if (eq) same++;
      else ok(false, `run-batch ${e.cid}: ${JSON.stringify(gist(url, g.response?.body))} vs the server's ${JSON.stringify(gist(url, w.json))}`);
    } else if (e.server) {
      ok(g.response?.status_code === 400 && g.response.body === null && g.error?.error?.param === 'max_tokens',
         `run-batch: a request the server refuses keeps its 400 and error object (${g.error?.error?.message})`);
    } else {
      const okk = g.response?.status_code === 400 && g.response.body === null && typeof g.error === 'string' && e.re.test(g.error) &&
        g.error.startsWith(`input line ${e.line}:`);
      if (okk) refused++;
      else ok(false, `run-batch: refusal at input line ${e.line}: ${JSON.stringify(g)}`);
    }
  });
  ok(same === reqs.length, `run-batch: ${same} of ${reqs.length} answers equal the TCP server's (chat, completions, responses; greedy, seeded, n 2)`);
  ok(refused === 7, `run-batch: ${refused} of 7 lines that are not requests refused, naming their line`);
  ok(got.every(g => /^batch_req_[0-9a-f]{24}$/.test(g.id) && /^m3-batch-[0-9a-f]{24}$/.test(g.response?.request_id)) &&
     new Set(got.map(g => g.id)).size === got.length, 'run-batch: ids and request ids, all distinct');
  ok(fs.readdirSync(work).every(f => !f.includes('.tmp-')), 'run-batch: no temporary file left');
  const deep = got.find(g => g.custom_id === `r${reqs.length - 1}`);
  ok(deep?.response?.status_code === 200 && deep.response.body.usage.completion_tokens === 3,
     'run-batch: a body nested 1,500 deep answered; of a duplicate key the last taken (max_tokens 3), as the server does');

  // the output: a symlink's target replaced (the link kept), the mode of the file replaced kept; a FIFO written in place
  const small = path.join(work, 'small.jsonl');
  fs.writeFileSync(small, [0, 1, 2].map(i => JSON.stringify({ custom_id: `m${i}`, method: 'POST', url: '/v1/completions',
    body: { prompt: `m${i}`, max_tokens: 2 } })).join('\n') + '\n');
  const target = path.join(work, 'target.jsonl'), link = path.join(work, 'link.jsonl');
  fs.writeFileSync(target, 'old\n', { mode: 0o600 });
  fs.chmodSync(target, 0o600);
  fs.rmSync(link, { force: true });
  fs.symlinkSync(target, link);
  const sl = runBatch(['-i', small, '-o', link, '-m', ck]);
  const tgt = fs.readFileSync(target, 'utf8'), tgtLines = tgt.split('\n').filter(Boolean);
  ok(sl.code === 0 && fs.lstatSync(link).isSymbolicLink() && tgtLines.length === 3 && tgtLines.every(l => l.startsWith('{')) &&
     (fs.statSync(target).mode & 0o777) === 0o600,
     `run-batch -o SYMLINK: the target replaced (${tgtLines.length} lines, mode ${(fs.statSync(target).mode & 0o777).toString(8)}), the link kept` +
     (tgtLines.length === 3 && tgt.startsWith('{') ? '' : ` [exit ${sl.code}; target ${JSON.stringify(tgt.slice(0, 80))}; ` +
      `files ${fs.readdirSync(work).filter(f => f.startsWith('target')).join(' ')}; stderr ${JSON.stringify(sl.stderr.slice(-600))}]`));
  const fifo = path.join(work, 'out.fifo');
  fs.rmSync(fifo, { force: true });
  execFileSync('mkfifo', [fifo]);
  const reader = spawn('cat', [fifo], { stdio: ['ignore', 'pipe', 'inherit'] });
  let fifoText = '';
  reader.stdout.on('data', d => { fifoText += d; });
  const readerExit = exitWithin(reader, 300000);
  const fr = spawn(m3, ['run-batch', '-i', small, '-o', fifo, '-m', ck, ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  const fre = await exitWithin(fr, 300000);
  await readerExit;
  ok(fre?.code === 0 && fs.statSync(fifo).isFIFO() && fifoText.split('\n').filter(Boolean).length === 3,
     `run-batch -o FIFO: written in place (exit ${fre?.code}, ${fifoText.split('\n').filter(Boolean).length} lines read from it), still a FIFO`);

  // standard input and output; --api-key (sent by the runner)
  const io = runBatch(['-i', '-', '-o', '-', '-m', ck, '--api-key', 'sekret', '--disable-log-requests', '--output-tmp-dir', work],
    [0, 1].map(i => JSON.stringify({ custom_id: `s${i}`, method: 'POST', url: '/v1/completions', body: { prompt: `p${i}`, max_tokens: 2 } })).join('\n'));
  const iol = io.stdout.split('\n').filter(Boolean).map(l => JSON.parse(l));
  ok(io.code === 0 && iol.length === 2 && iol.every((g, i) => g.custom_id === `s${i}` && g.response.status_code === 200),
     `run-batch -i - -o - --api-key (--output-tmp-dir taken): ${iol.length} answers on standard output, 200`);
  // empty input: an empty output
  const emF = path.join(work, 'empty.jsonl'), emO = path.join(work, 'empty.out');
  fs.writeFileSync(emF, '\n  \n');
  const em = runBatch(['-i', emF, '-o', emO, '-m', ck]);
  ok(em.code === 0 && fs.existsSync(emO) && fs.readFileSync(emO, 'utf8') === '', `run-batch on an empty input: exit ${em.code}, an empty output`);
  // a run that fails before answering leaves OUT as it was; refusals before anything loads
  const keep = path.join(work, 'keep.jsonl');
  fs.writeFileSync(keep, 'KEEP\n');
  const nm = runBatch(['-i', inF, '-o', keep, '-m', path.join(work, 'no-such-model')]);
  ok(nm.code !== 0 && fs.readFileSync(keep, 'utf8') === 'KEEP\n' && fs.readdirSync(work).every(f => !f.includes('.tmp-')),
     `run-batch with a model that does not load: exit ${nm.code}, OUT unchanged, no temporary file`);
  for (const [args, re, code] of [
    [['-i', path.join(work, 'missing.jsonl'), '-o', outF, '-m', ck], /cannot read .*missing\.jsonl: No such file/, 1],
    [['-i', 'https://example.com/in.jsonl', '-o', outF, '-m', ck], /URLs are not read or written/, 2],
    [['-i', inF, '-o', path.join(work, 'no-dir/out.jsonl'), '-m', ck], /cannot write beside .*no-dir\/out\.jsonl/, 1],
    [['-i', inF, '-m', ck], /-o OUTPUT is required/, 2],
    [['-i', inF, '-o', outF, '-m', ck, '--port', '8000'], /--port: the batch runner listens on nothing outside/, 2],
    [['-i', inF, '-o', outF, '-m', ck, '--no-such-flag'], /m3 run-batch: unknown option '--no-such-flag'/, 2],
  ]) {
    const r = runBatch(args);
    ok(r.code === code && re.test(r.stderr) && !/loaded /.test(r.stderr), `run-batch ${args.filter(a => a.startsWith('-')).join(' ')}: exit ${r.code}: ${r.stderr.trim().split('\n')[0]}`);
  }

  // SIGTERM mid-run: the requests in flight finish; the answers in order up to the first missing
  const longF = path.join(work, 'long.jsonl'), longO = path.join(work, 'long.out');
  const N = 12;
  fs.writeFileSync(longF, Array.from({ length: N }, (_, i) => JSON.stringify({ custom_id: `L${i}`, method: 'POST', url: '/v1/completions',
    body: { prompt: `Long ${i}`, max_tokens: 600, temperature: 0, ignore_eos: true } })).join('\n') + '\n');
  // (--shutdown-timeout 600: what was sent finishes, so that the server's 200s are the answers written and those not)
  const lp = spawn(m3, ['run-batch', '-i', longF, '-o', longO, '-m', ck, '--max-num-seqs', '1', '--enable-log-requests', '--shutdown-timeout', '600',
    ...extra], { stdio: ['ignore', 'ignore', 'pipe'] });
  let llog = '', sent = false;
  const lexit = new Promise(r => lp.on('exit', (code, signal) => r({ code, signal })));
  await new Promise(res => {
    lp.stderr.on('data', d => {
      llog += d;
      if (!sent && /m3 serve: req \d+ POST \/v1\/completions 200/.test(llog)) { sent = true; lp.kill('SIGTERM'); res(); }
    });
    lp.on('exit', res);
  });
  const le = await lexit;
  const lo = fs.existsSync(longO) ? lines(longO) : [];
  const m = /the answers to the first (\d+) requests are in .*long\.out; (\d+) more were sent and not written, (\d+) were not run/.exec(llog);
  ok(sent && le.code === 1 && m && Number(m[1]) === lo.length && lo.length >= 1 && lo.length + Number(m[2]) + Number(m[3]) === N,
     `run-batch, SIGTERM after the first answer: exit ${le.code}; ${m ? m[0] : llog.trim().split('\n').pop()}`);
  ok(lo.every((g, i) => g.custom_id === `L${i}` && g.response.status_code === 200 && g.response.body.usage.completion_tokens === 600),
     `run-batch, interrupted: the ${lo.length} answers written are the first, whole`);
  // (a request sent as the server stopped is answered 503, not reset unread: every one sent was run)
  const served = (llog.match(/m3 serve: req \d+ POST \/v1\/completions 200/g) || []).length;
  ok(m && served === lo.length + Number(m[2]),
     `run-batch, interrupted: written + sent and not written = the ${served} requests the server ran (${lo.length} + ${m ? m[2] : '?'})`);

  // SIGTERM while the input (a pipe) is open and silent: the run ends at once, the answers so far written
  const pipeO = path.join(work, 'pipe.out');
  const pp = spawn(m3, ['run-batch', '-i', '-', '-o', pipeO, '-m', ck, '--enable-log-requests', ...extra], { stdio: ['pipe', 'ignore', 'pipe'] });
  let plog = '';
  const pexit = exitWithin(pp, 120000);
  pp.stdin.write([0, 1].map(i => JSON.stringify({ custom_id: `p${i}`, method: 'POST', url: '/v1/completions', body: { prompt: `p${i}`, max_tokens: 2 } })).join('\n') + '\n');
  await new Promise(res => {
    pp.stderr.on('data', d => {
      plog += d;
      if (!pp.termed && (plog.match(/m3 serve: req \d+ POST/g) || []).length === 2) { pp.termed = true; pp.kill('SIGTERM'); res(); }
    });
    pp.on('exit', res);
  });
  const pe = await pexit;
  pp.stdin.destroy();
  const po = fs.existsSync(pipeO) ? lines(pipeO) : [];
  ok(pe !== null && pe.code === 1 && po.length === 2 && /the answers to the first 2 requests are in .*0 more were sent and not written, the rest of the input was not read/.test(plog),
     `run-batch -i - (a silent pipe), SIGTERM: ends (exit ${pe?.code ?? 'none: killed'}), ${po.length} answers: ${plog.trim().split('\n').pop()}`);
} catch (e) {
  ok(false, 'exception: ' + (e.stack || e));
}
const stop = await srv.stop();
ok(stop.code === 0, `server stopped cleanly (${stop.code ?? stop.signal})`);
console.log(R.failed ? `server_batch: ${R.failed} checks failed` : 'server_batch: all checks passed');
process.exit(R.failed ? 1 : 0);
