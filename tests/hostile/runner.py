"""The parent: draws the cases, feeds them to worker processes and records what killed a worker.

Each worker (:mod:`.worker`) runs a shard of the cases in order, one at a time, under a memory
limit.  A case that makes its worker die (a signal, an exit) or run past the time limit is
classified ``crash`` here; the worker is then started afresh and goes on with the next case.
Sharding is round-robin over the drawn cases, so a run with the same number of workers runs the
same cases in the same processes in the same order.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .classify import normalise
from .spec import Case

ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 3 * 2**30
"""Address space of a worker: importing torch, structconv and the cases takes about 0.65 GiB of it."""
WORKER = ".".join(Path(__file__).resolve().parent.relative_to(ROOT).parts) + ".worker"
"""The worker's module as ``python -m`` names it from the repository root, however this package was imported."""
CASE_SECONDS = 20.0
"""Time limit of one case."""
START_SECONDS = 180.0
"""Time limit of a worker's start (imports) on a loaded machine."""


class Worker:
    """One worker process and the lines it answers."""

    def __init__(self, index: int, sandbox: Path, memory: int) -> None:
        self.index, self.sandbox, self.memory = index, sandbox, memory
        self.log_path = sandbox.parent / f"worker{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.buffer = b""
        self.starts = 0

    def _env(self) -> dict[str, str]:
        home = self.sandbox / "home"
        env = {k: v for k, v in os.environ.items() if k not in ("STRUCTCONV_DATA", "STRUCTCONV_CACHE")}
        env.update(
            PYTHONPATH=str(ROOT),
            HOME=str(home),
            XDG_CACHE_HOME=str(home / ".cache"),
            STRUCTCONV_CACHE=str(home / "cache"),
            TMPDIR=str(self.sandbox / "work"),
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            OPENBLAS_NUM_THREADS="1",
            MALLOC_ARENA_MAX="2",
            PYTHONHASHSEED="0",
            PYTHONFAULTHANDLER="1",
            HOSTILE_MEMORY=str(self.memory),
        )
        return env

    def start(self) -> None:
        for sub in ("home", "work"):
            (self.sandbox / sub).mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=self.sandbox,
            env=self._env(),
            start_new_session=True,
        )
        log.close()
        self.buffer = b""
        self.starts += 1
        line = self._readline(START_SECONDS)
        if line is None or "ready" not in json.loads(line):
            raise RuntimeError(f"worker {self.index} did not start; see {self.log_path}:\n{self._log_tail()}")

    def _readline(self, timeout: float) -> str | None:
        """The next line the worker writes, or ``None`` at a timeout or when it exits."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def _log_tail(self, lines: int = 6) -> str:
        """What the worker printed for its last case: a fatal error and the innermost frames, if any."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        last = max((i for i, t in enumerate(text) if t.startswith("== case ")), default=-1)
        tail = [t for t in text[last + 1 :] if t.strip() and not t.startswith("Extension modules")]
        fatal = [t for t in tail if "Fatal Python error" in t]
        frames = [t.strip() for t in tail if t.strip().startswith("File ")]
        return "\n".join(fatal + frames[:lines]) if fatal else "\n".join(tail[-lines:])

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.proc = None

    def run(self, case: Case, timeout: float) -> dict[str, Any]:
        """The worker's record of ``case``, or a ``crash`` record if the case killed it or ran too long."""
        if self.proc is None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        start = time.perf_counter()
        try:
            self.proc.stdin.write((case.to_json() + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        described = repr(case.params)[:300]
        deadline = time.monotonic() + timeout
        while (line := self._readline(deadline - time.monotonic())) is not None:
            record: dict[str, Any] = json.loads(line)
            if "started" not in record:
                return record
            described = record["started"]
        seconds = time.perf_counter() - start
        code = self.proc.poll()
        self.stop()
        cause = f"timeout: no answer within {timeout:.0f} s" if code is None else _death(code)
        message = self._log_tail()
        fatal = message.partition("\n")[0]
        if "Fatal Python error:" in fatal:  # a fault the worker reported: the same cause whether it died or hung after
            cause = "fatal error: " + fatal.split("Fatal Python error:", 1)[1].strip()
        record = {"id": case.id, "entry": case.entry, "outcome": "crash", "cause": cause, "where": ""}
        message = normalise(message.replace(str(ROOT) + os.sep, ""), str(self.sandbox))
        record.update(input=described, expect="?", message=message, seconds=round(seconds, 3))
        _reap_canary(self.sandbox, record)
        return record


def _death(code: int) -> str:
    if code < 0:
        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with status {code}"


def _reap_canary(sandbox: Path, record: dict[str, Any]) -> None:
    """A payload may write the canary and then kill its worker: that is ``security``, not ``crash``."""
    from .worker import CANARY

    canary = sandbox / CANARY
    if canary.exists():
        record["outcome"], record["cause"] = "security", "a payload ran: the canary file was written"
        canary.unlink()


def run_cases(
    cases: Sequence[Case],
    workers: int = 2,
    memory: int = MEMORY_LIMIT,
    timeout: float = CASE_SECONDS,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``cases`` on ``workers`` worker processes; return one record per case, in the order given."""
    results: list[dict[str, Any] | None] = [None] * len(cases)
    done = [0]
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="structconv-hostile-") as tmp:

        def shard(index: int) -> None:
            worker = Worker(index, Path(tmp) / f"w{index}", memory)
            try:
                for i in range(index, len(cases), workers):
                    record = worker.run(cases[i], timeout)
                    with lock:
                        results[i] = record
                        done[0] += 1
                        if progress is not None:
                            progress(done[0], len(cases))
            finally:
                worker.stop()

        threads = [threading.Thread(target=shard, args=(i,), daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    missing = [cases[i].id for i, r in enumerate(results) if r is None]
    if missing:
        raise RuntimeError(f"{len(missing)} cases have no result (a worker could not start): {missing[:5]}")
    return [r for r in results if r is not None]
