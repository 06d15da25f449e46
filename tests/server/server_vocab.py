#!/usr/bin/env python3
"""A checkpoint whose vocab_size is padded past its tokenizer (issue 22), as real checkpoints are
(M3: 200,064 rows): the tiny checkpoint with the qwen3 tokenizer and vocab_size 151,700, served.
Ids no token spells must never come out, whatever the request asks (a logit_bias of +100 on
one), and wherever they still appear (prompt ids, echo) they decode to nothing: completions and
chat, stream and non-stream, with logprobs and top logprobs, echo, /detokenize; every answer
200, complete, with text a tokenizer spells. Ids past the model's vocabulary stay a 400.

  python3 tests/server/server_vocab.py M3_BINARY WORK_DIR"""
import asyncio
import json
import os
import subprocess
import sys

import srvlib
from srvlib import check
import load_test as lt

PADDED = 151700
HOLE = 151690  # a padded row: no token spells it


async def main(m3, work):
    base = srvlib.make_checkpoint(m3, os.path.join(work, "base"))
    with open(os.path.join(base, "config.json")) as f:
        cfg = json.load(f)
    tc = cfg.get("text_config", cfg)
    n_tok = tc["vocab_size"]
    check(n_tok < HOLE, f"the tokenizer spells {n_tok} ids, fewer than {HOLE}")
    tc["vocab_size"] = PADDED
    with open(os.path.join(work, "padded.json"), "w") as f:
        json.dump(cfg, f)
    ck = srvlib.make_checkpoint(m3, os.path.join(work, "ck"), ["--config", os.path.join(work, "padded.json")])
    with open(os.path.join(ck, "config.json")) as f:
        got = json.load(f)
    check(got.get("text_config", got)["vocab_size"] == PADDED, f"checkpoint vocab_size {PADDED}")
    srv = srvlib.Server(m3, ck)
    host, port = "127.0.0.1", srv.port
    try:
        check(f"the tokenizer spells {n_tok} of them" in srv.log, "the start-up log names the ids never sampled")
        bias = {str(HOLE): 100, str(PADDED - 1): 100}

        async def completion(extra, stream):
            body = {"prompt": "The padded rows", "max_tokens": 12, "ignore_eos": True, "logit_bias": bias, **extra}
            if not stream:
                return await lt.post_json(host, port, "/v1/completions", body)
            body.update(stream=True, stream_options={"include_usage": True})
            st, headers, r, w = await lt.http(host, port, "POST", "/v1/completions", body)
            raw = b"".join([p async for p in lt.body_chunks(r, headers, 120)])
            w.close()
            return st, raw.decode("utf-8", "replace")

        for temp in (0, 1.0):
            st, j = await completion({"temperature": temp, "logprobs": 5, "seed": 3}, False)
            ok = st == 200 and j["choices"][0]["finish_reason"] == "length" and j["usage"]["completion_tokens"] == 12
            check(ok, f"non-stream, T {temp}, +100 on padded ids: 200, 12 tokens ({st}: {str(j)[:200]})")
            if ok:
                lp = j["choices"][0]["logprobs"]
                check(len(lp["tokens"]) == 12 and "".join(lp["tokens"]) == j["choices"][0]["text"],
                      "logprob tokens spell the text")
                check(all(len(t) == 5 for t in lp["top_logprobs"]), "5 top logprobs a token, all with text")
            st, raw = await completion({"temperature": temp, "logprobs": 2, "seed": 3}, True)
            check(st == 200 and raw.rstrip().endswith("data: [DONE]") and '"error"' not in raw and
                  '"completion_tokens":12' in raw, f"stream, T {temp}: complete, no error event ({raw[-300:]!r})")
        # prompt ids holding padded ids: echoed as nothing
        ids = [9707, HOLE, 1879, PADDED - 1]
        st, j = await lt.post_json(host, port, "/v1/completions", {"prompt": ids, "max_tokens": 3, "echo": True,
                                                                 "temperature": 0})
        st2, d = await lt.post_json(host, port, "/detokenize", {"tokens": [9707, 1879]})
        check(st == 200 and st2 == 200 and j["choices"][0]["text"].startswith(d["prompt"]),
              f"echo of a prompt with padded ids: their text is nothing ({st}: {str(j)[:200]})")
        st, d = await lt.post_json(host, port, "/detokenize", {"tokens": [HOLE, PADDED - 1]})
        check(st == 200 and d["prompt"] == "", f"/detokenize of padded ids: '' ({st}: {d})")
        st, d = await lt.post_json(host, port, "/detokenize", {"tokens": [PADDED]})
        check(st == 400, f"/detokenize past the model's vocabulary: 400 ({st})")
        st, j = await lt.post_json(host, port, "/v1/completions", {"prompt": [PADDED], "max_tokens": 2})
        check(st == 400 and str(PADDED) in json.dumps(j), f"a prompt id past the model's vocabulary: 400 ({st}: {j})")
        st, j = await lt.post_json(host, port, "/v1/completions", {"prompt": "x", "max_tokens": 2,
                                                                 "logit_bias": {str(PADDED): 5}})
        check(st == 400, f"a logit_bias id past the model's vocabulary: 400 ({st})")
        # allowed_token_ids only of padded rows: nothing could be sampled (a 400, not a failed generation)
        st, j = await lt.post_json(host, port, "/v1/completions", {"prompt": "x", "max_tokens": 2,
                                                                 "allowed_token_ids": [HOLE, PADDED - 1]})
        check(st == 400 and j["error"]["param"] == "allowed_token_ids", f"allowed_token_ids of padded rows: 400 ({st}: {j})")
        st, j = await lt.post_json(host, port, "/v1/completions", {"prompt": "x", "max_tokens": 4, "temperature": 1,
                                                                 "allowed_token_ids": [HOLE, 1879], "logprobs": 0,
                                                                 "return_tokens_as_token_ids": True, "ignore_eos": True})
        check(st == 200 and j["choices"][0]["logprobs"]["tokens"] == ["token_id:1879"] * 4,
              f"allowed_token_ids with a padded row and 1879: only 1879 ({st}: {str(j)[:200]})")
        # chat, stream with top logprobs
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "ignore_eos": True,
                "logit_bias": bias, "logprobs": True, "top_logprobs": 3, "stream": True,
                "chat_template_kwargs": {"thinking_mode": "disabled"}}
        st, headers, r, w = await lt.http(host, port, "POST", "/v1/chat/completions", body)
        raw = b"".join([p async for p in lt.body_chunks(r, headers, 120)]).decode("utf-8", "replace")
        w.close()
        check(st == 200 and raw.rstrip().endswith("data: [DONE]") and '"error"' not in raw,
              f"chat stream with top logprobs: complete ({raw[-300:]!r})")
        m = await lt.metrics(host, port)
        check(m.get('m3_requests_finished_total{finish_reason="error"}', 0) == 0, "no request ended in an error")
    finally:
        srv.stop()
    # m3 generate on the same checkpoint is not affected: ids there are ids
    r = subprocess.run([m3, "generate", "-m", ck, "--ids", f"9707,{HOLE}", "-n", "2"], capture_output=True, text=True)
    check(r.returncode == 0, f"m3 generate reads a prompt with padded ids ({r.stderr[-200:]})")


if __name__ == "__main__":
    srvlib.run(main, "server_vocab", __doc__)
