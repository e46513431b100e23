"""`agentrl serve-env ENV --port N`: any agentrl env served over HTTP, JSON in and out, with the
standard library's `ThreadingHTTPServer` (docs/your-env.md, "An env over HTTP"; the client is
`envs.remote`).

The endpoints follow OpenEnv's names where they fit (`/health`, `/reset`, `/step`, `/schema`,
`episode_id`, `request_id`, `observation`/`reward`/`done`/`metadata` in answers) and add what
training needs: a spec per seed and options (`/specs`), task lists (`/tasks`), snapshots by
handle (`/snapshot`, `/restore`, `/release`) and the scripted expert (`/expert`).

The server holds the envs (one per `episode_id`) and their snapshots; what crosses the wire is
text, numbers and handles, never a pickled object. Both are bounded: the least recently used
env beyond `max_episodes` and snapshot beyond `max_snapshots` are released (a later call on one
is refused, 404 or 410, naming the bound), and a client releases envs it dropped. A call that
changes an env carries the client's `request_id`; the server keeps each env's last answer, so a
retried call returns it instead of stepping twice.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import random
import socket
import threading
import uuid
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from ..errors import ConfigError
from .base import Task, make_env_spec
from .guard import reward_range
from .remote import dumps

MAX_REQUEST_BYTES = 64 * 1024 * 1024   # the largest request body read


class Refusal(Exception):
    """A request the server refuses: an HTTP status and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class Held:
    """One served env and the answer to its last request (a retry gets it again)."""

    env: Any
    spec_id: str
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    last_request: Any = None
    last_answer: dict | None = None


@dataclasses.dataclass
class Served:
    """One spec (an env world at a seed and options) and the tasks it listed, by id and prompt."""

    spec: Any
    tasks: dict = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def digest(state: Any) -> str:
    """A state's fingerprint (its pickle's sha256): equal for snapshots of equal states; ""
    for a state that does not pickle (it then equals no other)."""
    try:
        return hashlib.sha256(pickle.dumps(state)).hexdigest()
    except Exception:  # noqa: BLE001  (a snapshot need not pickle when it stays on the server)
        return ""


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


class EnvServer:
    """The served env's state: specs by seed and options, envs by episode id, snapshots by
    handle, each bounded (`max_specs`, `max_episodes`, `max_snapshots`)."""

    def __init__(self, section, max_episodes: int = 4096, max_snapshots: int = 20000,
                 max_specs: int = 16):
        if min(max_episodes, max_snapshots, max_specs) < 1:
            raise ConfigError("serve-env: --max-episodes and --max-snapshots must be at least 1")
        self.section = section
        self.max_episodes, self.max_snapshots, self.max_specs = max_episodes, max_snapshots, max_specs
        self.specs: OrderedDict[str, Served] = OrderedDict()
        self.episodes: OrderedDict[str, Held] = OrderedDict()
        self.snapshots: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self.lock = threading.Lock()
        self.calls = 0
        self.connections: set = set()    # open client sockets (closed with the server)
        make_env_spec(section)            # a spec that does not build: its one-line error now

    # ------------------------------------------------------------------ bookkeeping
    def _bounded(self, table: OrderedDict, key: str, value: Any, limit: int) -> None:
        with self.lock:
            table[key] = value
            table.move_to_end(key)
            while len(table) > limit:
                table.popitem(last=False)

    def _get(self, table: OrderedDict, key: Any, status: int, missing: str):
        with self.lock:
            if not isinstance(key, str) or key not in table:
                raise Refusal(status, missing)
            table.move_to_end(key)
            return table[key]

    def served(self, spec_id: Any) -> Served:
        return self._get(self.specs, spec_id, 404, f"no spec {spec_id!r} here (the server "
                         "restarted?): connect again")

    def not_held(self, episode_id: Any) -> Refusal:
        return Refusal(404, f"episode {episode_id} is not held: the server keeps the "
                            f"{self.max_episodes} most recently used envs (serve-env "
                            "--max-episodes), or it restarted")

    def release(self, episode_ids: Any = (), snapshot_ids: Any = ()) -> int:
        """Drop the envs and snapshots named (ids it does not hold are ignored) -> how many."""
        with self.lock:
            n = sum(self.episodes.pop(i, None) is not None for i in episode_ids or ()
                    if isinstance(i, str))
            return n + sum(self.snapshots.pop(i, None) is not None for i in snapshot_ids or ()
                           if isinstance(i, str))

    # ------------------------------------------------------------------ endpoints
    def health(self, payload: dict) -> dict:
        with self.lock:
            return {"status": "healthy", "env": self.section.name, "episodes": len(self.episodes),
                    "snapshots": len(self.snapshots), "max_episodes": self.max_episodes,
                    "max_snapshots": self.max_snapshots}

    def schema(self, payload: dict) -> dict:
        """What `/specs` gives for the server's own seed and options (OpenEnv's `/schema`)."""
        return self.specs_({"seed": self.section.seed, "options": {}})

    def specs_(self, payload: dict) -> dict:
        seed, options = payload.get("seed", self.section.seed), payload.get("options") or {}
        if not isinstance(seed, int) or not isinstance(options, dict):
            raise Refusal(400, "/specs takes {\"seed\": int, \"options\": {name: value}}")
        spec_id = hashlib.sha256(json.dumps([seed, options], sort_keys=True).encode()).hexdigest()[:16]
        with self.lock:
            known = self.specs.get(spec_id)
        if known is None:
            section = dataclasses.replace(self.section, seed=seed,
                                          options={**self.section.options, **options})
            try:
                known = Served(make_env_spec(section))
            except ConfigError as e:
                raise Refusal(400, str(e)) from None
            self._bounded(self.specs, spec_id, known, self.max_specs)
        spec, env = known.spec, known.spec.make()
        return {"spec_id": spec_id, "name": self.section.name,
                "system_prompt": getattr(env, "system_prompt", ""),
                "max_turns": getattr(env, "max_turns", None),
                "reward_range": list(reward_range(spec)) if getattr(spec, "reward_range", None) else None,
                "tool_schemas": getattr(spec, "tool_schemas", None),
                "tools_system_prompt": getattr(spec, "tools_system_prompt", None),
                "expert": callable(getattr(spec, "expert", None)),
                "step_call": callable(getattr(env, "step_call", None)),
                "oracle_value": callable(getattr(env, "oracle_value", None))}

    def tasks(self, payload: dict) -> dict:
        served = self.served(payload.get("spec_id"))
        split, n = payload.get("split"), payload.get("n")
        if not isinstance(split, str) or not (n is None or isinstance(n, int)):
            raise Refusal(400, "/tasks takes {\"spec_id\", \"split\": str, \"n\": int or null}")
        with served.lock:
            try:
                tasks = served.spec.tasks(split, n)
            except ConfigError as e:
                raise Refusal(400, str(e)) from None
            served.tasks.update(((t.task_id, t.prompt), t) for t in tasks)
        return {"tasks": [{"task_id": t.task_id, "prompt": t.prompt, "answer": t.answer,
                           "meta": t.meta} for t in tasks]}

    def _task(self, served: Served, payload: Any) -> Task:
        if not isinstance(payload, dict) or "task_id" not in payload or "prompt" not in payload:
            raise Refusal(400, "/reset takes a task: {\"task_id\", \"prompt\", \"answer\", \"meta\"}")
        known = served.tasks.get((payload["task_id"], payload["prompt"]))
        return known or Task(str(payload["task_id"]), str(payload["prompt"]),
                             str(payload.get("answer", "")), dict(payload.get("meta") or {}))

    def _started(self, held: Held) -> dict:
        return {"episode_id": None, "system_prompt": getattr(held.env, "system_prompt", ""),
                "max_turns": getattr(held.env, "max_turns", None)}

    def reset(self, payload: dict, held: Held) -> dict:
        spec_id = payload.get("spec_id")
        served = self.served(spec_id)
        task = self._task(served, payload.get("task"))
        if held.env is None or held.spec_id != spec_id:
            self._start(held, spec_id, served)
        obs = held.env.reset(task)
        return {**self._started(held), "observation": {"text": obs}, "reward": None, "done": False}

    @staticmethod
    def _start(held: Held, spec_id: str, served: Served) -> None:
        with served.lock:
            held.env, held.spec_id = served.spec.make(), spec_id

    def step(self, payload: dict, held: Held) -> dict:
        action = payload.get("action")
        if isinstance(action, dict) and isinstance(action.get("tool"), str) \
                and isinstance(action.get("arguments"), dict) and callable(getattr(held.env, "step_call", None)):
            res = held.env.step_call(action["tool"], action["arguments"])
        elif isinstance(action, dict) and isinstance(action.get("message"), str):
            res = held.env.step(action["message"])
        else:
            raise Refusal(400, "/step takes {\"episode_id\", \"request_id\", \"action\": "
                               "{\"message\": str} or, for an env with step_call, {\"tool\": str, "
                               "\"arguments\": {...}}}")
        return {"observation": {"text": res.observation}, "reward": res.reward,
                "done": bool(res.terminated or res.truncated), "terminated": res.terminated,
                "truncated": res.truncated, "metadata": res.info}

    def snapshot(self, payload: dict, held: Held) -> dict:
        state = held.env.snapshot()
        snapshot_id = uuid.uuid4().hex
        self._bounded(self.snapshots, snapshot_id, (held.spec_id, state), self.max_snapshots)
        return {"snapshot_id": snapshot_id, "digest": digest(state)}

    def restore(self, payload: dict, held: Held) -> dict:
        spec_id, state = self._get(
            self.snapshots, payload.get("snapshot_id"), 410,
            f"snapshot {payload.get('snapshot_id')} was released: the server keeps the "
            f"{self.max_snapshots} most recent (serve-env --max-snapshots)")
        self._start(held, spec_id, self.served(spec_id))   # a fresh env, as the protocol restores into
        held.env.restore(state)
        return self._started(held)

    def oracle_value(self, payload: dict, held: Held) -> dict:
        return {"value": float(held.env.oracle_value())}

    def expert(self, payload: dict, held: Held) -> dict:
        served = self.served(held.spec_id)
        rng = random.Random(int(payload.get("seed", 0)))
        return {"action": served.spec.expert(held.env, rng, float(payload.get("error_rate", 0.0)))}

    # ------------------------------------------------------------------ dispatch
    def on_episode(self, path: str, fn: Callable[[dict, Held], dict], payload: dict) -> dict:
        """`fn` on the request's env, once per `request_id` (a retry gets the first answer);
        `/reset` and `/restore` start an env under a new id, the others need a started one."""
        episode_id, request_id = payload.get("episode_id"), payload.get("request_id")
        if not isinstance(episode_id, str) or not episode_id:
            raise Refusal(400, "the request has no episode_id")
        with self.lock:
            held = self.episodes.get(episode_id)
            if held is None and path in ("/reset", "/restore"):
                held = self.episodes[episode_id] = Held(None, "")
                while len(self.episodes) > self.max_episodes:
                    self.episodes.popitem(last=False)
            elif held is not None:
                self.episodes.move_to_end(episode_id)
        with held.lock if held is not None else threading.Lock():
            if held is None or (held.env is None and path not in ("/reset", "/restore")):
                raise self.not_held(episode_id)
            if request_id is not None and held.last_request == request_id:
                return held.last_answer
            try:
                answer = fn(payload, held)
            except BaseException:
                if held.env is None:      # a start that failed holds nothing
                    self.release([episode_id])
                raise
            held.last_request, held.last_answer = request_id, answer
        return answer

    def answer(self, method: str, path: str, payload: dict) -> tuple[int, dict]:
        """(HTTP status, JSON answer) of one request."""
        self.calls += 1
        if isinstance(payload.get("release"), list):   # envs the client dropped since its last call
            self.release(payload["release"], payload.get("release_snapshots") or ())
        routes = {("GET", "/health"): self.health, ("GET", "/schema"): self.schema,
                  ("POST", "/specs"): self.specs_, ("POST", "/tasks"): self.tasks,
                  ("POST", "/release"): lambda p: {"released": self.release(
                      p.get("episode_ids"), p.get("snapshot_ids"))}}
        episode_routes = {"/reset": self.reset, "/step": self.step, "/snapshot": self.snapshot,
                          "/restore": self.restore, "/expert": self.expert,
                          "/oracle_value": self.oracle_value}
        try:
            if (method, path) in routes:
                return 200, routes[(method, path)](payload)
            if method == "POST" and path in episode_routes:
                return 200, self.on_episode(path, episode_routes[path], payload)
            raise Refusal(404, f"no endpoint {method} {path}")
        except Refusal as e:
            return e.status, {"error": str(e)}
        except Exception as e:  # noqa: BLE001  (the served env raised: the client's episode fails)
            return 500, {"error": _one_line(e)}


def handler_for(server: EnvServer) -> type[BaseHTTPRequestHandler]:
    """The request handler of `server`: JSON bodies, keep-alive, no request log."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True   # headers and body leave at once (no delayed-ACK stall)

        def _reply(self, status: int, payload: dict) -> None:
            body = dumps(payload)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _serve(self, method: str) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_REQUEST_BYTES:
                self.close_connection = True
                return self._reply(413, {"error": f"a request of over {MAX_REQUEST_BYTES:,} bytes"})
            try:
                payload = json.loads(self.rfile.read(n) or b"{}") if n else {}
            except ValueError:
                return self._reply(400, {"error": "the request body is not JSON"})
            if not isinstance(payload, dict):
                return self._reply(400, {"error": "the request body is not a JSON object"})
            self._reply(*server.answer(method, self.path, payload))

        def setup(self) -> None:
            super().setup()
            with server.lock:
                server.connections.add(self.connection)

        def finish(self) -> None:
            with server.lock:
                server.connections.discard(self.connection)
            super().finish()

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def open_server(server: EnvServer, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server of `server` bound to `host:port` (0: a free port), not yet serving."""
    try:
        httpd = ThreadingHTTPServer((host, port), handler_for(server))
    except OSError as e:
        raise ConfigError(f"serve-env: cannot listen on {host}:{port} ({_one_line(e)})") from None
    httpd.daemon_threads = True
    return httpd


def url_of(httpd: ThreadingHTTPServer) -> str:
    host, port = httpd.server_address[:2]
    return f"http://{host}:{port}"


class RunningServer:
    """A server answering on a background thread (`serve_in_thread`): its `url`, its state
    (`server`) and `close()`; a context manager."""

    def __init__(self, server: EnvServer, httpd: ThreadingHTTPServer):
        self.server, self.httpd, self.url = server, httpd, url_of(httpd)
        self.thread = threading.Thread(target=httpd.serve_forever, name="agentrl-env-server",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop answering: the listening socket and every open connection are closed."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()
        with self.server.lock:
            for sock in list(self.server.connections):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve_in_thread(server: EnvServer, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """`server` answering at `host:port` (0: a free port) on a daemon thread of this process."""
    return RunningServer(server, open_server(server, host, port))
