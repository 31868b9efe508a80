"""One `vllm serve` process, always stopped: `with Server(cli, model, args, log) as s: ... s.url`.

The server runs in a session of its own (its engine and worker processes with it), so stopping it signals the whole
process group: SIGTERM, then SIGKILL after `stop_timeout_s`. It is stopped on every way out of the `with` block
(success, an exception, a timeout, Ctrl-C; SIGTERM, which Slurm sends on preemption and at the time limit, is turned
into an exception by `stop_on_signals`), and it is told to die with its parent (Linux `PR_SET_PDEATHSIG`) in case
that parent is killed outright.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def http_json(url: str, body: dict | None = None, timeout: float = 30) -> dict:
    """GET (or POST `body` as JSON to) one of the server's endpoints; the parsed JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode() or "null")


class ServerError(RuntimeError):
    """The server exited or never became healthy; the message carries the end of its log."""


class Server:
    """`vllm serve <model> <args>` on a free local port (or `url`: a server someone else runs, left alone)."""

    def __init__(
        self,
        cli: Path | str | None,
        model: str,
        args: list[str],
        log: Path,
        *,
        url: str | None = None,
        model_name: str | None = None,
        startup_timeout_s: float = 900,
        stop_timeout_s: float = 30,
        env: dict | None = None,
    ):
        self.cli, self.model, self.args, self.log = cli, model, list(args), Path(log)
        self.model_name = model_name or model  # what requests name (--served-model-name)
        self.external = url is not None
        self.port = None if url else free_port()
        self.url = url.rstrip("/") if url else f"http://127.0.0.1:{self.port}"
        self.startup_timeout_s, self.stop_timeout_s = startup_timeout_s, stop_timeout_s
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def command(self) -> list[str]:
        return [str(self.cli), "serve", self.model, "--host", "127.0.0.1", "--port", str(self.port), *self.args]

    def __enter__(self) -> Server:
        if self.external:
            self.wait_healthy()
            return self
        self.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                env={**os.environ, **(self.env or {})},
            )
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_healthy(self) -> None:
        """Poll /health until it answers 200; fail early if the process exits, late after the startup timeout."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.tail()
                if "on kv cache allocation is less than requested memory" in tail:
                    raise ServerError(
                        "vllm serve: too little free host memory for its KV cache (the log: "
                        f"{self.log}); free memory or set backend.cpu_kv_cache_mib lower"
                    )
                raise ServerError(f"vllm serve exited with code {self.proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        raise ServerError(f"vllm serve not healthy after {self.startup_timeout_s:.0f} s at {self.url}: {self.tail()}")

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left after the timeout; idempotent."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        for sig, wait in ((signal.SIGTERM, self.stop_timeout_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(pgid):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=0.2)
                time.sleep(0.05)
            if not _group_alive(pgid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self.proc = None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def get(self, path: str) -> dict:
        return http_json(f"{self.url}{path}")

    def post(self, path: str, body: dict) -> dict:
        return http_json(f"{self.url}{path}", body)


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies of ours are reaped by wait)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a group whose only members are zombies still answers signal 0: look at /proc
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


@contextlib.contextmanager
def stop_on_signals(*signals: int):
    """Turn SIGTERM (and the other `signals`) into SystemExit inside the block, so `with Server(...)` blocks unwind
    and stop their servers (Slurm sends SIGTERM on preemption and at the time limit); the old handlers come back."""
    signals = signals or (signal.SIGTERM,)

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    old = {}
    try:
        for s in signals:
            with contextlib.suppress(ValueError):  # not the main thread: leave the handlers alone
                old[s] = signal.signal(s, handler)
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def greedy_tokens(server: Server, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """The server's greedy continuation of a prompt given as token ids (`/v1/completions`, eos ignored, token ids
    returned): for checking outputs against the HF engine's, not for timing (`vllm bench serve` times)."""
    body = {
        "model": server.model_name,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    return list(server.post("/v1/completions", body)["choices"][0]["token_ids"])
