#!/usr/bin/env python3
"""`m3 serve` started the way vLLM users start vLLM (issue 26): the model as a positional argument,
--flag=value, vLLM's size suffixes, its switches (--enable-prefix-caching, --enable-auto-tool-choice,
--trust-remote-code), --tool-call-parser / --reasoning-parser minimax_m3, --kv-cache-dtype
fp8_e4m3, --seed. What m3 cannot do is refused with exit status 2 and a line naming it.

  python3 tests/server/server_cli.py M3_BINARY WORK_DIR"""
import asyncio
import json
import os
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
    srv = srvlib.Server(m3, ck, ["--kv-cache-memory=512M", "--max-model-len", "32k", "--enable-prefix-caching",
                                 "--enable-auto-tool-choice", "--tool-call-parser", "minimax_m3",
                                 "--reasoning-parser=minimax_m3", "--trust-remote-code", "--kv-cache-dtype", "fp8_e4m3",
                                 "--seed", "7"])
    # (srvlib passes -m CK; the positional form is checked below)
    try:
        st, text = await lt.get_text("127.0.0.1", srv.port, "/v1/models")
        mml = json.loads(text)["data"][0]["max_model_len"]
        check(st == 200 and mml == 32000, f"--max-model-len 32k: a context of {mml} tokens")
        check("KV cache fp8" in srv.log and "0.50 GiB (--kv-cache-memory)" in srv.log,
              "--kv-cache-dtype fp8_e4m3 and --kv-cache-memory=512M: an fp8 pool of 0.50 GiB")
        body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "ignore_eos": True}
        st, a = await lt.post_json("127.0.0.1", srv.port, "/v1/completions", body)
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
    r.terminate()
    r.wait(60)
    refused(m3, [ck, "--tool-call-parser", "hermes"], "minimax_m3")
    refused(m3, [ck, "--kv-cache-memory", "4X"], "suffixes")
    refused(m3, [ck, "/elsewhere"], "two models")
    refused(m3, [ck, "--enable-prefix-caching=1"], "takes no value")
    refused(m3, [ck, "--speculative-mode", "x"], "unknown option '--speculative-mode'")
    refused(m3, [ck, "--kv-cache-dtype", "fp8_e5m2"], "unknown dtype 'fp8_e5m2'")
    refused(m3, [], "model directory is required")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    os.makedirs(sys.argv[2], exist_ok=True)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
    print(f"{srvlib.fails} check(s) failed" if srvlib.fails else "server_cli: all checks passed")
    sys.exit(1 if srvlib.fails else 0)
