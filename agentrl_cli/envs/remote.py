"""An env in another process or on another machine: `--env http://HOST:PORT` (docs/your-env.md,
"An env over HTTP").

`agentrl serve-env ENV --port N` (`envs.env_server`) serves any agentrl env; this module is the
client: `connect(url, seed, **options)` returns a `RemoteSpec` whose envs (`RemoteEnv`) forward
`reset`, `step`, `snapshot` and `restore` to the server as JSON over HTTP (standard library only).

- **Episodes by id.** The client names each env it makes (`episode_id`); the server keeps one
  env per id. An env this process no longer holds is released on the next call.
- **Snapshots by handle.** `snapshot()` returns a `RemoteSnapshot`: the server's handle and a
  digest of the state, never the state itself, so FOCUS and VinePPO fork an env they cannot
  see, and a handle travels to Ray rollout workers pickled. A handle dropped in the process
  that made it (never pickled) is released on the next call; the server keeps a bounded
  number in any case (`serve-env --max-snapshots`), and a released handle is a one-line error
  naming that bound.
- **Timeouts and retries.** Every call waits at most `remote_timeout_s` seconds per try and is
  tried `1 + remote_retries` times. Each call that changes an env carries a request id the
  server remembers, so a retried step is applied once: every call is idempotent and retried.
- **Server gone.** A server that does not answer after the retries is an `EnvContractError`:
  one line naming the URL, and the run stops (an episode cannot fail quietly on it).
"""
from __future__ import annotations

import functools
import http.client
import itertools
import json
import socket
import threading
import time
import uuid
import weakref
from typing import Any, Callable
from urllib.parse import urlsplit

from ..errors import ConfigError
from .base import StepResult, Task
from .guard import EnvContractError

SCHEMES = ("http://", "https://")
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRIES = 2
BACKOFF_S = 0.25      # the first retry's wait; doubled for each further one
MAX_BODY = 256 * 1024 * 1024   # the largest answer read (an observation is bounded by the guard)


def is_url(name: str) -> bool:
    """Whether env `name` is a served env's URL."""
    return name.startswith(SCHEMES)


class RemoteEnvError(RuntimeError):
    """The served env raised inside `reset` or `step` (the server's one-line account of it):
    like an exception of an env in this process, it ends that episode as a failed one."""


class ServerGone(EnvContractError):
    """The server did not answer after every retry: the run stops with one line."""

    why = ""      # the last try's failure, in words


class _Refused(Exception):
    """An answer that is a refusal (an HTTP error status), with the server's message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _json_default(value: Any) -> Any:
    """Task metadata and step info may hold tuples, sets or objects: sent as lists or text."""
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, default=_json_default).encode()


class Connection:
    """JSON calls to one server: a keep-alive connection per thread, `timeout_s` per try,
    `retries` more tries after a failure to connect, a timeout or a dropped connection."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES):
        parts = urlsplit(url)
        if not parts.hostname or parts.path not in ("", "/"):
            raise ConfigError(f"env '{url}': expected http://HOST:PORT (the address `agentrl "
                              "serve-env` prints)")
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"env '{url}': the port is not a number") from None
        self.url, self.host = url.rstrip("/"), parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.https = parts.scheme == "https"
        self.timeout_s, self.retries = float(timeout_s), int(retries)
        if self.timeout_s <= 0 or self.retries < 0:
            raise ConfigError(f"env '{url}': remote_timeout_s must be > 0 and remote_retries >= 0")
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = self._local.conn = cls(self.host, self.port, timeout=self.timeout_s)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _once(self, method: str, path: str, body: bytes | None) -> dict:
        conn = self._conn()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read(MAX_BODY + 1)
        if len(data) > MAX_BODY:
            raise _Refused(413, f"an answer of over {MAX_BODY:,} bytes")
        try:
            payload = json.loads(data or b"{}")
        except ValueError:
            raise _Refused(resp.status, f"an answer that is not JSON (HTTP {resp.status})") from None
        if resp.status >= 400:
            raise _Refused(resp.status, str(payload.get("error", f"HTTP {resp.status}")))
        return payload

    def call(self, path: str, payload: dict | None = None) -> dict:
        """POST `payload` (GET without one) to `path` -> the JSON answer. A refusal raises
        `_Refused`; no answer after every try raises `ServerGone`."""
        body = None if payload is None else dumps(payload)
        method = "GET" if payload is None else "POST"
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(BACKOFF_S * 2 ** (attempt - 1))
            try:
                return self._once(method, path, body)
            except _Refused:
                raise
            except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out
                self._drop()
                last = e
        why = ("no answer within remote_timeout_s="
               f"{self.timeout_s:g} s" if isinstance(last, (socket.timeout, TimeoutError))
               else f"{type(last).__name__}: {' '.join(str(last).split())}")
        gone = ServerGone(self.url, f"the env server is gone: {method} {path} failed "
                                    f"{self.retries + 1} time(s) ({why}); is `agentrl serve-env` "
                                    f"still running at {self.url}?")
        gone.why = why
        raise gone


class RemoteSnapshot:
    """A snapshot kept by the server: its handle, and a digest of the state (two snapshots of
    equal states compare equal, as the fork check asks). It pickles as plain data. The object
    `snapshot()` returned releases the server's copy when it is dropped, unless it was ever
    copied or pickled (a Ray worker or a tree may still hold the copy): those stay until the
    server's `--max-snapshots` bound releases them."""

    __slots__ = ("snapshot_id", "digest", "_owner")

    def __init__(self, snapshot_id: str = "", digest: str = "", owner: "RemoteSpec | None" = None):
        self.snapshot_id, self.digest, self._owner = snapshot_id, digest, owner

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteSnapshot) and bool(self.digest) and self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"RemoteSnapshot({self.snapshot_id!r})"

    def __reduce__(self):
        self._owner = None        # a copy lives on elsewhere: never released from here
        return RemoteSnapshot, (self.snapshot_id, self.digest)

    def __del__(self):
        owner = getattr(self, "_owner", None)
        if owner is not None:
            owner.release(self.snapshot_id, snapshot=True)


def task_payload(task: Task) -> dict:
    return {"task_id": task.task_id, "prompt": task.prompt, "answer": task.answer,
            "meta": task.meta}


def task_from(payload: dict) -> Task:
    return Task(str(payload["task_id"]), str(payload["prompt"]), str(payload["answer"]),
                dict(payload.get("meta") or {}))


class RemoteEnv:
    """One served env (the protocol of `envs.base.TextEnv`). Its server-side env exists from
    the first `reset` or `restore`; dropping this object releases it."""

    def __init__(self, spec: "RemoteSpec"):
        self.spec = spec
        self.episode_id = uuid.uuid4().hex
        self._requests = itertools.count(1)
        self._started = False
        self.system_prompt: str = spec.info.get("system_prompt", "")
        self.max_turns = spec.info.get("max_turns")
        if spec.info.get("step_call"):   # the served env takes JSON tool calls (envs.tool_calls)
            self.step_call = self._step_call
        if spec.info.get("oracle_value"):   # the served env knows a state's success probability
            self.oracle_value = lambda: float(self._call("/oracle_value")["value"])

    def _call(self, path: str, **payload: Any) -> dict:
        payload.update(episode_id=self.episode_id, request_id=next(self._requests))
        return self.spec.call(path, payload)

    def _started_as(self, answer: dict) -> None:
        self._started = True
        self.system_prompt = answer.get("system_prompt", self.system_prompt)
        self.max_turns = answer.get("max_turns", self.max_turns)

    def reset(self, task: Task) -> str:
        answer = self._call("/reset", spec_id=self.spec.spec_id, task=task_payload(task))
        self._started_as(answer)
        return answer["observation"]["text"]

    def step(self, action: str) -> StepResult:
        return self._result(self._call("/step", action={"message": action}))

    def _step_call(self, name: str, arguments: dict) -> StepResult:
        return self._result(self._call("/step", action={"tool": name, "arguments": arguments}))

    @staticmethod
    def _result(answer: dict) -> StepResult:
        return StepResult(answer["observation"]["text"], answer["reward"], answer["terminated"],
                          answer["truncated"], answer.get("metadata") or {})

    def snapshot(self) -> RemoteSnapshot:
        answer = self._call("/snapshot")
        return RemoteSnapshot(answer["snapshot_id"], answer["digest"], self.spec)

    def restore(self, state: Any) -> None:
        if not isinstance(state, RemoteSnapshot):
            raise TypeError(f"a served env restores a RemoteSnapshot, not a {type(state).__name__}")
        self._started_as(self._call("/restore", spec_id=self.spec.spec_id,
                                    snapshot_id=state.snapshot_id))

    def __del__(self):
        if getattr(self, "_started", False):
            self.spec.release(self.episode_id)


class RemoteSpec:
    """The spec of a served env at one seed and options (`envs.base.EnvSpec`): tasks, the
    reward range and tool schemas the server declares, and the scripted expert when the
    served env has one."""

    def __init__(self, conn: Connection, seed: int, options: dict):
        self.conn = conn
        self._released: tuple[list[str], list[str]] = ([], [])   # envs, snapshots dropped
        self._lock = threading.Lock()
        # what is still to release when this spec goes (or the process ends): sent at once
        weakref.finalize(self, _flush, conn.url, self._released, self._lock)
        self.info = self.call("/specs", {"seed": seed, "options": options})
        self.spec_id: str = self.info["spec_id"]
        self.name = self.info.get("name", conn.url)
        for key in ("reward_range", "tool_schemas", "tools_system_prompt"):
            if self.info.get(key) is not None:
                setattr(self, key, self.info[key])
        if self.info.get("expert"):
            self.expert = self._expert

    def call(self, path: str, payload: dict | None = None) -> dict:
        """A call to the server, with the episodes dropped since the last one to release; a
        refusal is a one-line error (`refusal`)."""
        if payload is not None:
            envs, snaps = _take(self._released, self._lock)
            if envs or snaps:
                payload = {**payload, "release": envs, "release_snapshots": snaps}
        try:
            return self.conn.call(path, payload)
        except _Refused as e:
            raise refusal(self.conn.url, path, e) from None

    def release(self, handle: str, snapshot: bool = False) -> None:
        """Release an env (or a snapshot) this process dropped, with the next call."""
        with self._lock:
            self._released[int(snapshot)].append(handle)

    def make(self) -> RemoteEnv:
        return RemoteEnv(self)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        answer = self.call("/tasks", {"spec_id": self.spec_id, "split": split, "n": n})
        return [task_from(t) for t in answer["tasks"]]

    def _expert(self, env: RemoteEnv, rng, error_rate: float = 0.0) -> str:
        """The served env's scripted expert on `env`'s state; the server seeds its own
        `random.Random` from `rng`."""
        return env._call("/expert", seed=rng.getrandbits(63), error_rate=float(error_rate))["action"]


def _take(released: tuple[list[str], list[str]], lock: threading.Lock) -> tuple[list, list]:
    with lock:
        out = (list(released[0]), list(released[1]))
        released[0].clear(), released[1].clear()
    return out


def _flush(url: str, released: tuple[list[str], list[str]], lock: threading.Lock) -> None:
    """Release what a spec that is going had still to release: one try, a short wait, and
    a server that is gone is no error."""
    envs, snaps = _take(released, lock)
    if envs or snaps:
        try:
            Connection(url, timeout_s=2.0, retries=0).call(
                "/release", {"episode_ids": envs, "snapshot_ids": snaps})
        except Exception:  # noqa: BLE001  (best effort: the server's bounds release them anyway)
            pass


def refusal(url: str, path: str, e: _Refused) -> Exception:
    """The error for a server's refusal: the served env raised (`RemoteEnvError`, status 500:
    a failed episode, as in process); a handle the server no longer holds (404, 410) or any
    other refusal stops the run (`EnvContractError`); a bad spec request (400) is the user's
    mistake (`ConfigError`)."""
    if e.status == 500:
        return RemoteEnvError(str(e))
    if e.status == 400:
        return ConfigError(f"env '{url}': the server refused: {e}")
    return EnvContractError(url, f"{path}: {e}")


def factory_of(scheme: str, rest: str) -> Callable[..., Any]:
    """The env factory of `SCHEME:REST` (`http://HOST:PORT`, registered per scheme): `connect`
    to that URL, called as a user env's factory is."""
    return functools.partial(connect, f"{scheme}:{rest}")


def connect(url: str, seed: int = 0, remote_timeout_s: float = DEFAULT_TIMEOUT_S,
            remote_retries: int = DEFAULT_RETRIES, **options: Any) -> RemoteSpec:
    """The spec of the env served at `url` with world seed `seed` and `options` (the served
    env's options, on top of those `serve-env` was given); `remote_timeout_s` and
    `remote_retries` are this client's. A server that does not answer is a one-line
    `ConfigError` naming `agentrl serve-env`."""
    conn = Connection(url, remote_timeout_s, remote_retries)
    try:
        return RemoteSpec(conn, seed, options)
    except ServerGone as e:
        raise ConfigError(f"env '{url}': no env server answers there ({e.why}, "
                          f"{conn.retries + 1} tries); start one with `agentrl serve-env ENV "
                          f"--port {conn.port}`") from None
