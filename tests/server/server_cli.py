#!/usr/bin/env python3
"""`m3 serve` started the way vLLM users start vLLM (issue 26): the model as a positional argument,
--flag=value, vLLM's size suffixes, its switches (--enable-prefix-caching, --enable-auto-tool-choice,
--trust-remote-code), --tool-call-parser / --reasoning-parser minimax_m3, --kv-cache-dtype
fp8_e4m3, --seed. What m3 cannot do is refused with exit status 2 and a line naming it. And what
vLLM's clients read besides the completions: /version, /v1/models/{id}, X-Request-Id, ids that
never repeat, message.reasoning.

  python3 tests/server/server_cli.py M3_BINARY WORK_DIR"""
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys

import srvlib
from srvlib import check
import load_test as lt


def refused(m3, args, want):
    r = subprocess.run([m3, "serve", *args], capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and want in r.stderr, f"m3 serve {' '.join(args)}: exit 2 naming it ({r.returncode}: "
          f"{r.stderr.strip().splitlines()[0] if r.stderr.strip() else ''})")


async def main(m3, work):
    ck = srvlib.make_checkpoint(m3, os.path.join(work, "ck"))
    # the launch line of a vLLM user, with m3's own port 0 for the test
    tmpl = os.path.join(work, "chat_template.jinja")
    with open(tmpl, "w") as f:
        f.write("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    srv = srvlib.Server(m3, ck, ["--kv-cache-memory=512M", "--max-model-len", "32k", "--enable-prefix-caching",
                                 "--enable-auto-tool-choice", "--tool-call-parser", "minimax_m3",
                                 "--reasoning-parser=minimax_m3", "--trust-remote-code", "--kv-cache-dtype", "fp8_e4m3",
                                 "--seed", "7", "--gpu-memory-utilization", "0.5", "--chat-template", tmpl,
                                 "--served-model-name", "m3-main", "m3-alias", "--generation-config", "vllm"])
    # (srvlib passes -m CK; the positional form is checked below)
    try:
        st, text = await lt.get_text("127.0.0.1", srv.port, "/v1/models")
        mml = json.loads(text)["data"][0]["max_model_len"]
        check(st == 200 and mml == 32000, f"--max-model-len 32k: a context of {mml} tokens")
        check("KV cache fp8" in srv.log and "0.50 GiB (--kv-cache-memory)" in srv.log,
              "--kv-cache-dtype fp8_e4m3 and --kv-cache-memory=512M: an fp8 pool of 0.50 GiB")
        body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "ignore_eos": True}
        st, a = await lt.post_json("127.0.0.1", srv.port, "/v1/completions", body)
        # several --served-model-name: both listed and accepted, responses name the first
        st_m, text = await lt.get_text("127.0.0.1", srv.port, "/v1/models")
        ids = [d["id"] for d in json.loads(text)["data"]]
        st_a, j = await lt.post_json("127.0.0.1", srv.port, "/v1/completions",
                                     {"model": "m3-alias", "prompt": "x", "max_tokens": 1})
        st_n, _ = await lt.post_json("127.0.0.1", srv.port, "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1})
        st_i, _ = await lt.get_text("127.0.0.1", srv.port, "/v1/models/m3-alias")
        check(ids == ["m3-main", "m3-alias"] and st_a == 200 and j["model"] == "m3-main" and st_n == 404 and st_i == 200,
              f"--served-model-name m3-main m3-alias: /v1/models {ids}, 'm3-alias' accepted ({st_a}, answered as "
              f"{j.get('model')}), another name 404 ({st_n}), /v1/models/m3-alias {st_i}")
        # --chat-template FILE: the prompt is the given template's
        st_t, jt = await lt.post_json("127.0.0.1", srv.port, "/tokenize", {"messages": [{"role": "user", "content": "hello"}]})
        st_p, jp = await lt.post_json("127.0.0.1", srv.port, "/tokenize", {"prompt": "<<hello>>"})
        check(st_t == 200 and jt["tokens"] == jp["tokens"], f"--chat-template FILE renders the messages ({jt.get('tokens')} "
              f"vs {jp.get('tokens')})")
        check("chat template from " + tmpl in srv.log, "the log names the template's file")
    finally:
        srv.stop()
    # --seed: requests without a seed draw the same from a server started with the same seed
    r = subprocess.Popen([m3, "serve", ck, "--port=0", "--seed=7", "--kv-cache-memory", "512M", "--kv-cache-dtype=fp8"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    port = None
    for raw in r.stderr:
        line = raw.decode()
        if "listening on" in line:
            port = int(line.split("http://", 1)[1].split(":")[1].split(" ")[0])
            break
    check(port is not None, "m3 serve DIR --port=0 (the model positional) starts")
    if port:
        st, b = await lt.post_json("127.0.0.1", port, "/v1/completions", body)
        check(st == 200 and a["choices"][0]["text"] == b["choices"][0]["text"],
              "--seed 7 twice: the same sampled text for the same first request without a seed")
        await api_identity(port)
    r.terminate()
    r.wait(60)
    await generation_config(m3, work)
    await cors(m3, ck)
    refused(m3, [ck, "--allowed-origins", '["https://a", 3]'], "non-empty string")
    refused(m3, [ck, "--allowed-origins", "https://a,,https://b"], "empty item")
    refused(m3, [ck, "--tool-call-parser", "hermes"], "minimax_m3")
    # --model=DIR, as vLLM's launch lines spell it
    r = subprocess.Popen([m3, "serve", f"--model={ck}", "--port=0", "--kv-cache-memory=256M"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    up = False
    for raw in r.stderr:  # ends at EOF when the server exits instead
        if b"listening on" in raw:
            up = True
            break
    r.terminate()
    r.wait(60)
    check(up, "m3 serve --model=DIR starts")
    refused(m3, [ck, "--chat-template", "{% if %}"], "--chat-template")
    refused(m3, [ck, "--served-model-name", ""], "an empty name")
    refused(m3, [ck, "--kv-cache-memory", "4X"], "suffixes")
    refused(m3, [ck, "/elsewhere"], "two models")
    refused(m3, [ck, "--enable-prefix-caching=1"], "takes no value")
    refused(m3, [ck, "--speculative-mode", "x"], "unknown option '--speculative-mode'")
    refused(m3, [ck, "--kv-cache-dtype", "fp8_e5m2"], "unknown dtype 'fp8_e5m2'")
    refused(m3, [], "model directory is required")
    refused(m3, [ck, "--warmup-tokens", "-1"], "--warmup-tokens")
    await warmup(m3, ck)
    await vllm_flags(m3, work, ck)


async def vllm_flags(m3, work, ck):
    """vLLM's flags without an m3 option of their own: taken (silently when m3 does that anyway, with
    a line when they tune what m3 does its own way), two served for real, the rest refused"""
    line = ["--enable-chunked-prefill", "--disable-log-stats", "--dtype", "bfloat16", "--enforce-eager",
            "--enable-expert-parallel", "--block-size=16", "--swap-space", "4", "--uvicorn-log-level", "warning",
            "--disable-uvicorn-access-log", "--data-parallel-size", "1", "--load-format", "safetensors",
            "--compilation-config", '{"level": 3}', "--enable-force-include-usage", "--return-tokens-as-token-ids",
            "--kv-cache-memory", "256M", "-O3", "-tp=1", "--max_model_len", "4096", "-ep", "--no-enforce-eager",
            "--compilation-config.cudagraph_mode", "FULL", "--async-scheduling", "--limit-mm-per-prompt", '{"image": 64}']
    srv = srvlib.Server(m3, ck, line)
    try:
        notes = [ln for ln in srv.log.splitlines() if "taken, not used" in ln]
        want = ("--block-size 16 taken", "--swap-space 4 taken", "--uvicorn-log-level warning taken",
                "--compilation-config {\"level\": 3} taken", "-O 3 taken", "--compilation-config FULL taken",
                "--async-scheduling taken")
        check(len(notes) == len(want) and all(any(f in ln for ln in notes) for f in want),
              f"a vLLM launch line (-O3, -tp=1, --max_model_len, dotted keys too): the server runs; the {len(want)} tuning "
              f"flags m3 does not use said in a line each ({len(notes)})")
        check("--limit-mm-per-prompt: 64 images a request asked, m3 takes at most 32" in srv.log,
              "--limit-mm-per-prompt over m3's 32: taken, said")
        st, text = await lt.get_text("127.0.0.1", srv.port, "/v1/models")
        check(st == 200 and json.loads(text)["data"][0]["max_model_len"] == 4096, "--max_model_len 4096 (vLLM's underscores)")
        # --return-tokens-as-token-ids: the default of return_tokens_as_token_ids, a request may say otherwise
        body = {"prompt": "Hello there", "max_tokens": 4, "temperature": 0, "logprobs": 1, "ignore_eos": True}
        st, a = await lt.post_json("127.0.0.1", srv.port, "/v1/completions", body)
        st2, b = await lt.post_json("127.0.0.1", srv.port, "/v1/completions", {**body, "return_tokens_as_token_ids": False})
        ta, tb = a["choices"][0]["logprobs"]["tokens"], b["choices"][0]["logprobs"]["tokens"]
        check(st == 200 and st2 == 200 and all(t.startswith("token_id:") for t in ta) and "".join(tb) == b["choices"][0]["text"],
              f"--return-tokens-as-token-ids: {ta[:2]}...; a request's false: the text's tokens {tb[:2]}...")
        # --enable-force-include-usage: a stream without stream_options ends with usage
        status, headers, r, w = await lt.http("127.0.0.1", srv.port, "POST", "/v1/completions",
                                              {"prompt": "Hi", "max_tokens": 3, "stream": True, "ignore_eos": True})
        raw = b"".join([p async for p in lt.body_chunks(r, headers, 60)]).decode()
        w.close()
        evs = [json.loads(x[6:]) for x in raw.split("\n") if x.startswith("data: {")]
        check(status == 200 and evs and evs[-1].get("usage", {}).get("completion_tokens") == 3 and not evs[-1]["choices"],
              "--enable-force-include-usage: a stream without stream_options ends with a usage chunk")
        # --disable-uvicorn-access-log: no line per request
        check(not re.search(r"m3 serve: req \d+ ", srv.log), "--disable-uvicorn-access-log: no request lines")
    finally:
        srv.stop()
    refused(m3, [ck, "--dtype", "float16"], "m3 takes auto|bfloat16|bf16")
    refused(m3, [ck, "--ssl-keyfile", "k.pem"], "TLS-terminating proxy")
    refused(m3, [ck, "--enable-lora"], "no LoRA")
    refused(m3, [ck, "--data-parallel-size", "2"], "no data parallelism")
    refused(m3, [ck, "--hf-overrides", "{}"], "config.json as it is")
    # --tokenizer DIR: the tokenizer (and its config's chat template) from elsewhere; a checkpoint without one
    bare, tokdir = os.path.join(work, "bare"), os.path.join(work, "tokdir")
    for d in (bare, tokdir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    for f in os.listdir(ck):
        shutil.copy(os.path.join(ck, f), os.path.join(tokdir if f.startswith("tokenizer") else bare, f))
    r = subprocess.run([m3, "serve", bare, "--port", "0"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "tokenizer" in r.stderr, f"a checkpoint without its tokenizer: exit 1 ({r.stderr.strip()[-100:]})")
    r = subprocess.run([m3, "serve", bare, "--port", "0", "--tokenizer", work], capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "tokenizer (--tokenizer): " + work in r.stderr,
          f"--tokenizer DIR without one: exit 1 naming it ({r.stderr.strip()[-120:]})")
    body = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    answers = []
    for args in ([ck], [bare, "--tokenizer", tokdir]):
        srv = srvlib.Server(m3, args[0], [*args[1:], "--kv-cache-memory", "256M"])
        try:
            st, j = await lt.post_json("127.0.0.1", srv.port, "/v1/chat/completions", body)
            answers.append(j["choices"][0]["message"]["content"] if st == 200 else None)
        finally:
            srv.stop()
    check(answers[0] is not None and answers[0] == answers[1], "--tokenizer DIR: the same chat answer as the checkpoint's own")
    # the checkpoint's template (chat_template.jinja here) rendered with the --tokenizer directory's special tokens
    with open(os.path.join(bare, "chat_template.jinja"), "w") as f:
        f.write("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    srv = srvlib.Server(m3, bare, ["--tokenizer", tokdir, "--kv-cache-memory", "256M"])
    try:
        st, j = await lt.post_json("127.0.0.1", srv.port, "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]})
        st2, j2 = await lt.post_json("127.0.0.1", srv.port, "/tokenize", {"prompt": "]~!b[Hi"})
        check(st == 200 and st2 == 200 and j["tokens"] == j2["tokens"] and len(j["tokens"]) >= 2,
              f"--tokenizer DIR with the checkpoint's template: its bos_token from DIR ({j.get('tokens')})")
    finally:
        srv.stop()
    refused(m3, [ck, "--enable-chunked-prefill=true"], "takes no value")
    refused(m3, [ck, "--async-scheduling=1"], "--async-scheduling takes no value")
    refused(m3, [ck, "--block-size"], "--block-size needs a value")


async def warmup(m3, ck):
    """--warmup-tokens N: a step of N prompt tokens and a decode before listening, neither counted in
    /metrics nor left in the prefix cache, and the answers the same as without it."""
    host, body = "127.0.0.1", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    flags = ["--kv-cache-memory", "64M", "--enable-prefix-caching"]
    srv = srvlib.Server(m3, ck, flags + ["--warmup-tokens", "200"])
    try:
        m0 = await lt.metrics(host, srv.port)
        st, a = await lt.post_json(host, srv.port, "/v1/completions", body)
        m1 = await lt.metrics(host, srv.port)
    finally:
        srv.stop()
    check("warm-up: 200 prompt tokens" in srv.log, "--warmup-tokens 200: the log says the warm-up ran")
    fin = lambda m: sum(v for k, v in m.items() if k.startswith("m3_requests_finished_total"))
    check(fin(m0) == 0 and m0.get("m3_engine_steps_total") == 0 and m0.get("m3_engine_prefill_tokens_total") == 0
          and m0.get("m3_kv_blocks_cached") == 0,
          f"after the warm-up: no request, step or prefill counted, nothing cached ({fin(m0)}, "
          f"{m0.get('m3_engine_steps_total')}, {m0.get('m3_engine_prefill_tokens_total')}, {m0.get('m3_kv_blocks_cached')})")
    check(st == 200 and fin(m1) == 1 and m1.get("m3_engine_prefill_tokens_total") == a["usage"]["prompt_tokens"],
          f"then one request: counted alone ({fin(m1)} finished, {m1.get('m3_engine_prefill_tokens_total')} tokens prefilled)")
    srv = srvlib.Server(m3, ck, flags + ["--warmup-tokens", "0"])
    try:
        st0, b = await lt.post_json(host, srv.port, "/v1/completions", body)
    finally:
        srv.stop()
    check("warm-up" not in srv.log and st0 == 200 and a["choices"][0]["text"] == b["choices"][0]["text"],
          "--warmup-tokens 0: no warm-up, and the same greedy text as the warmed server's")


async def generation_config(m3, work):
    """The checkpoint's generation_config.json gives the sampling defaults (vLLM's --generation-config
    auto): greedy there makes a request without temperature greedy; --generation-config vllm keeps
    OpenAI's defaults; a bad file stops the server naming the file and the field."""
    ck = srvlib.make_checkpoint(m3, os.path.join(work, "gck"))
    with open(os.path.join(ck, "generation_config.json"), "w") as f:
        json.dump({"temperature": 0.0, "top_k": 1, "bos_token_id": 1}, f)
    texts = {}
    modes = {"auto": ["--generation-config", "auto"], "vllm": ["--generation-config", "vllm"],
             # --override-generation-config: over OpenAI's defaults, and over the file's
             "vllm+greedy": ["--generation-config", "vllm", "--override-generation-config", '{"temperature": 0}'],
             "auto+hot": ["--override-generation-config", '{"temperature": 1.0, "top_k": -1}']}
    for mode, margs in modes.items():
        srv = srvlib.Server(m3, ck, margs)
        try:
            got = []
            for body in ({"prompt": "Hello", "max_tokens": 12, "ignore_eos": True},
                         {"prompt": "Hello", "max_tokens": 12, "ignore_eos": True},
                         {"prompt": "Hello", "max_tokens": 12, "ignore_eos": True, "temperature": 0}):
                st, j = await lt.post_json("127.0.0.1", srv.port, "/v1/completions", body)
                got.append(j["choices"][0]["text"] if st == 200 else None)
            texts[mode] = got
            if mode == "auto":
                check("sampling defaults from" in srv.log and "temperature 0" in srv.log, "the start-up log names the defaults")
        finally:
            srv.stop()
    a, v, vg, ah = texts["auto"], texts["vllm"], texts["vllm+greedy"], texts["auto+hot"]
    check(a[0] is not None and a[0] == a[1] == a[2], "generation_config.json temperature 0: a request without one is greedy")
    check(v[0] is not None and v[0] != v[2] and v[1] != v[2], "--generation-config vllm: OpenAI's temperature 1")
    check(vg[0] is not None and vg[0] == vg[1] == vg[2] == a[2],
          "--generation-config vllm --override-generation-config '{\"temperature\": 0}': greedy without one")
    check(ah[0] is not None and ah[0] != ah[2] and ah[1] != ah[2] and ah[2] == a[2],
          "--override-generation-config '{\"temperature\": 1.0, \"top_k\": -1}' over the file's greedy: sampled")
    refused(m3, [ck, "--override-generation-config", '{"do_sample": false}'], "'do_sample': m3 takes temperature")
    # max_new_tokens: the max_tokens of requests without one; null: the file's temperature unset
    srv = srvlib.Server(m3, ck, ["--override-generation-config", '{"max_new_tokens": 5, "temperature": null}'])
    try:
        st, j = await lt.post_json("127.0.0.1", srv.port, "/v1/completions", {"prompt": "Hello", "ignore_eos": True})
        st2, j2 = await lt.post_json("127.0.0.1", srv.port, "/v1/completions", {"prompt": "Hello", "ignore_eos": True, "max_tokens": 7})
        check(st == 200 and j["usage"]["completion_tokens"] == 5 and st2 == 200 and j2["usage"]["completion_tokens"] == 7,
              "--override-generation-config max_new_tokens 5: requests without max_tokens get 5, with 7 get 7")
        check("top_k 1 max_tokens 5" in srv.log and "temperature" not in srv.log.split("sampling defaults", 1)[1].split("\n", 1)[0],
              "... and temperature null: the file's temperature unset (the start-up line)")
    finally:
        srv.stop()
    refused(m3, [ck, "--override-generation-config", '{"top_p": 2}'], "'top_p' must be a number in [0, 1]")
    refused(m3, [ck, "--override-generation-config", "[]"], "a JSON object of sampling defaults is expected")
    refused(m3, [ck, "--override-generation-config", "{temp"], "not JSON")
    with open(os.path.join(ck, "generation_config.json"), "w") as f:
        f.write('{"temperature": "hot"}')
    r = subprocess.run([m3, "serve", ck, "--port", "0"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "generation_config.json: 'temperature'" in r.stderr,
          f"a bad generation_config.json: exit 1 naming the field ({r.stderr.strip()[-120:]})")


async def raw_exchange(port, data):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    out = await r.read()
    w.close()
    head = out.split(b"\r\n\r\n", 1)[0].decode()
    hd = {}
    for ln in head.split("\r\n")[1:]:
        k, _, v = ln.partition(":")
        hd.setdefault(k.strip().lower(), v.strip())
    return int(head.split()[1]), hd


async def cors(m3, ck):
    """--allowed-origins (vLLM's JSON list, or comma-separated): an allowed origin's requests are
    answered with Access-Control-Allow-Origin and its preflights with 204; others get neither;
    without the flag CORS is off."""
    pre = ("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: {o}\r\nAccess-Control-Request-Method: POST\r\n"
           "Access-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n")
    get = "GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: {o}\r\nConnection: close\r\n\r\n"
    for flag in ('["https://ok.example", "http://localhost:3000"]', "https://ok.example, http://localhost:3000"):
        srv = srvlib.Server(m3, ck, ["--allowed-origins", flag])
        try:
            st, hd = await raw_exchange(srv.port, pre.format(o="https://ok.example").encode())
            check(st == 204 and hd.get("access-control-allow-origin") == "https://ok.example" and
                  "POST" in hd.get("access-control-allow-methods", "") and
                  hd.get("access-control-allow-headers") == "authorization, content-type" and "content-length" not in hd,
                  f"--allowed-origins {flag}: a preflight from an allowed origin gets 204 and the CORS headers ({st}, {hd})")
            st, hd = await raw_exchange(srv.port, get.format(o="http://localhost:3000").encode())
            check(st == 200 and hd.get("access-control-allow-origin") == "http://localhost:3000" and hd.get("vary") == "Origin",
                  f"... its GET answered with Access-Control-Allow-Origin ({hd.get('access-control-allow-origin')})")
            st, hd = await raw_exchange(srv.port, pre.format(o="https://evil.example").encode())
            check(st == 405 and "access-control-allow-origin" not in hd,
                  f"... a preflight from another origin: 405 without CORS headers ({st})")
            st, hd = await raw_exchange(srv.port, get.format(o="https://evil.example").encode())
            check(st == 200 and "access-control-allow-origin" not in hd, "... its GET: no Access-Control-Allow-Origin")
        finally:
            srv.stop()
    srv = srvlib.Server(m3, ck, ["--allowed-origins", '["*"]'])
    try:
        st, hd = await raw_exchange(srv.port, get.format(o="https://any.example").encode())
        check(st == 200 and hd.get("access-control-allow-origin") == "*", f'--allowed-origins ["*"]: any origin ({hd})')
    finally:
        srv.stop()
    srv = srvlib.Server(m3, ck, [])
    try:
        st, hd = await raw_exchange(srv.port, get.format(o="https://ok.example").encode())
        st2, _ = await raw_exchange(srv.port, pre.format(o="https://ok.example").encode())
        check(st == 200 and "access-control-allow-origin" not in hd and st2 == 405,
              f"without --allowed-origins: no CORS headers, preflights 405 ({st2})")
    finally:
        srv.stop()


async def api_identity(port):
    """What vLLM's clients read besides the completions: /version, /v1/models/{id}, X-Request-Id,
    ids that never repeat, message.reasoning beside reasoning_content."""
    host = "127.0.0.1"
    st, text = await lt.get_text(host, port, "/version")
    check(st == 200 and json.loads(text)["version"], f"/version: {text}")
    st, text = await lt.get_text(host, port, "/v1/models")
    mid = json.loads(text)["data"][0]["id"]
    from urllib.parse import quote
    st, text = await lt.get_text(host, port, "/v1/models/" + quote(mid, safe=""))
    check(st == 200 and json.loads(text)["id"] == mid, f"/v1/models/{{id}}: the model ({st})")
    st, text = await lt.get_text(host, port, "/v1/models/nope")
    check(st == 404 and json.loads(text)["error"]["code"] == 404, f"/v1/models/nope: 404 ({st})")
    # X-Request-Id: echoed, else made
    status, headers, r, w = await lt.http(host, port, "GET", "/health")
    w.close()
    made = headers.get("x-request-id", "")
    r2, w2 = await asyncio.open_connection(host, port)
    w2.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Request-Id: trace-42\r\nConnection: close\r\n\r\n")
    raw = await r2.read()
    w2.close()
    check(len(made) == 32 and b"X-Request-Id: trace-42" in raw, f"X-Request-Id: made ({made}), echoed when given")
    ids = set()
    for _ in range(3):
        st, j = await lt.post_json(host, port, "/v1/completions", {"prompt": "x", "max_tokens": 1})
        ids.add(j["id"])
    check(len(ids) == 3 and all(len(i) > 20 for i in ids), f"response ids never repeat: {sorted(ids)[0]} ...")
    # a batch of prompts: n choices each, indexed prompt * n + choice, each as its prompt alone
    prompts = ["Once upon a time", [11, 12, 13], "The"]
    body = {"prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "echo": True}
    st, j = await lt.post_json(host, port, "/v1/completions", body)
    alone = []
    for p in prompts:
        st1, j1 = await lt.post_json(host, port, "/v1/completions", dict(body, prompt=p, n=1))
        alone.append((j1["choices"][0]["text"], j1["usage"]["prompt_tokens"]))
    got = sorted((c["index"], c["text"]) for c in j.get("choices", []))
    want = [(p * 2 + k, alone[p][0]) for p in range(3) for k in range(2)]
    check(st == 200 and got == want and j["usage"]["prompt_tokens"] == sum(a[1] for a in alone) and
          got[0][1].startswith("Once upon a time"),
          f"a batch of 3 prompts x n 2: 6 choices, each its prompt's echo + greedy text alone ({st}; "
          f"{got[:2]} ... vs {want[:2]})")
    status, headers, r, w = await lt.http(host, port, "POST", "/v1/completions", dict(body, stream=True))
    raw = b"".join([p async for p in lt.body_chunks(r, headers, 60)])
    w.close()
    events = [json.loads(x[6:]) for x in raw.decode().split("\n\n") if x.startswith("data: {")]
    idx = sorted({e["choices"][0]["index"] for e in events if e.get("choices")})
    check(idx == list(range(6)), f"... streamed: chunks for the 6 choices ({idx})")
    # include_stop_str_in_output: the matched stop string ends the text
    st, j = await lt.post_json(host, port, "/v1/completions", {"prompt": "Hello", "max_tokens": 24, "temperature": 0,
                                                             "ignore_eos": True})
    full = j["choices"][0]["text"]
    stop = full[3:5] if len(full) >= 5 else None
    if stop:
        cut = full[:full.index(stop)]
        st1, j1 = await lt.post_json(host, port, "/v1/completions", {"prompt": "Hello", "max_tokens": 24, "temperature": 0,
                                                                   "ignore_eos": True, "stop": [stop]})
        st2, j2 = await lt.post_json(host, port, "/v1/completions", {"prompt": "Hello", "max_tokens": 24, "temperature": 0,
                                                                   "ignore_eos": True, "stop": [stop],
                                                                   "include_stop_str_in_output": True})
        check(j1["choices"][0]["text"] == cut and j2["choices"][0]["text"] == cut + stop,
              f"include_stop_str_in_output: the stop string {stop!r} ends the text only when asked")
    for extra in ({"guided_whitespace_pattern": " "}, {"structured_outputs": {"structural_tag": "{}"}}):
        st, j = await lt.post_json(host, port, "/v1/completions", {"prompt": "x", "max_tokens": 2, **extra})
        check(st == 400 and j["error"]["param"] == list(extra)[0], f"{list(extra)[0]}: refused (400), never ignored")
    for extra, want in (({"guided_regex": "a{2}b"}, "aab"), ({"structured_outputs": {"choice": ["xyz"]}}, "xyz"),
                        ({"guided_grammar": "root ::= \"x\" y\ny ::= \"y\"{2}"}, "xyy")):
        st, j = await lt.post_json(host, port, "/v1/completions", {"prompt": "x", "max_tokens": 16, **extra})
        check(st == 200 and j["choices"][0]["text"] == want and j["choices"][0]["finish_reason"] == "stop",
              f"{list(extra)[0]}: served ({j['choices'][0]['text'] if st == 200 else st!r})")
    st, j = await lt.post_json(host, port, "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "think"}], "max_tokens": 8, "ignore_eos": True})
    msg = j["choices"][0]["message"] if st == 200 else {}
    check(st == 200 and msg.get("reasoning") and msg.get("reasoning") == msg.get("reasoning_content"),
          "message.reasoning beside reasoning_content (thinking on)")


if __name__ == "__main__":
    srvlib.run(main, "server_cli", __doc__)
