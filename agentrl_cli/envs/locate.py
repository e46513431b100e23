"""The built-in "locate" env: LocBench in miniature (issue -> files to edit).

Every task has its own seeded repository of Python-like files, `pkg/mod/file.py`, each holding
two or three one-line functions. A function either calls one other function
(`return check_token(x)`) or raises an error (`raise ValueError("expired token")`); every error
message is raised in several places. The issue names a function and the error it ends in:
`Issue: load_user fails with "expired token".` The file to fix is the one that raises it at the
end of the named function's call chain, `hops` functions long (hops=1: the named function raises
it). Grepping the message alone finds every place that raises it; following the calls is exact.

Tools (the whole assistant message is exactly one call, see `calls.py`); paths are relative to
the repository root, and absolute paths or `..` are refused with an error observation:
  ls(PATH)          -> the entries of a folder on one line, numbered (`[1] auth/ [2] db/`;
                       `ls(.)` is the root)
  grep(TEXT)        -> up to 5 numbered lines containing TEXT (case-insensitive literal),
                       `[1] path: line`
  open(PATH)        -> the file's text; a `grep` result's number opens the file at its line:
                       that line to the end, then `(K lines above)` when it is not the first
  answer(F1, F2...) -> ends the episode with files ranked best first. info carries Acc@1 (the
                       first file is the gold one) and Acc@5 (it is among the first five);
                       reward = success = Acc@1.
Wherever a path is asked for, a number N names the N-th result of the latest `ls` or `grep`
(`open(1)`, `answer(2, 1)`): the agent refers to a path it has seen instead of copying it, as
tool-using agents refer to a search result by its id, and `open` of a `grep` result jumps to
the hit as an editor does. A number with no such result is an error.

Everything is deterministic from the seed (`random.Random`, never the global RNG).
"""
from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .base import ENVS, Task, env_factory
from .calls import CallEnv, check_call_cost
from .tool_calls import function_tool

__all__ = [
    "Repo",
    "LocateEnv",
    "LocateSpec",
    "MALFORMED",
    "OUTSIDE",
    "SYSTEM_PROMPT",
    "make_locate_spec",
    "make_repo",
    "resolve_path",
]

SYSTEM_PROMPT = ("Find the file to fix. One call per message: ls(path), grep(text), open(path), "
                 "answer(files, best first).")
MALFORMED = "error: use ls(path), grep(text), open(path) or answer(files)"
OUTSIDE = "error: path outside the repository"
TOOLS = ("ls", "grep", "open", "answer")
# the tools as JSON schemas, for models that call tools in their own format (model.tool_format)
TOOL_SCHEMAS = (
    function_tool("ls", "List a folder's entries, numbered.",
                  path=("string", "a folder, relative to the root (. is the root), or the "
                                  "number of a result of the latest ls/grep")),
    function_tool("grep", "Find up to 5 lines containing the text (case-insensitive), as "
                          "numbered `[N] path: line`.",
                  text=("string", "the literal text to find")),
    function_tool("open", "Open a file; returns its text.",
                  path=("string", "a file, relative to the root, or the number of a result "
                                  "of the latest ls/grep")),
    function_tool("answer", "Give the files to fix, best first; ends the episode.",
                  files=("string", "comma-separated file paths or result numbers, best first")),
)
TOOLS_SYSTEM_PROMPT = "Find the file to fix using the tools, one call per message; end with answer."
GREP_HITS = 5
MAX_HOPS = 5
MIN_FILES, MAX_FILES = 8, 200

_PKGS = ("core", "auth", "db", "net", "api", "cache", "jobs", "mail", "ui", "io")
_MODS = ("base", "sync", "store", "query", "view", "model", "task", "http", "conf", "rpc",
         "util", "log")
_FILES = ("reader", "writer", "parser", "client", "server", "handler", "loader", "router",
          "schema", "session", "tokens", "worker", "queue", "index", "table", "form", "cursor",
          "pool", "codec", "filter")
_VERBS = ("load", "save", "parse", "read", "write", "send", "fetch", "check", "build", "sync",
          "merge", "split", "scan", "track", "find", "push", "pull", "clean", "format", "apply",
          "reset", "start", "encode", "decode", "render", "update", "close", "flush")
_NOUNS = ("user", "token", "row", "page", "file", "config", "header", "order", "item", "cart",
          "mail", "event", "job", "key", "cache", "image", "report", "entry", "field", "path",
          "batch", "record", "query", "session", "price", "table", "node", "link", "date", "rule")
_ADJS = ("bad", "missing", "invalid", "empty", "stale", "broken", "unknown", "duplicate",
         "expired", "corrupt", "locked", "null")
_OBJS = ("header", "token", "key", "field", "value", "id", "page", "entry", "range", "format",
         "checksum", "state")
_LEAF_SHARE = 0.35          # functions that raise; the rest are spread over depths 2..MAX_HOPS
_PER_MESSAGE = 3            # about how many functions raise each message


# ------------------------------------------------------------------------------ repository
@dataclass(frozen=True)
class Repo:
    files: dict[str, str]                # path -> text
    dirs: dict[str, tuple[str, ...]]     # folder ("" is the root) -> entries, folders end in "/"
    defined_in: dict[str, str]           # function -> path
    callee: dict[str, str | None]        # function -> the function it calls (None: it raises)
    message: dict[str, str]              # raising function -> its error message
    depth: dict[str, int]                # 1 for a raising function, 1 + callee's otherwise

    def chain(self, fn: str) -> list[str]:
        out = [fn]
        while self.callee[out[-1]] is not None:
            out.append(self.callee[out[-1]])
        return out

    def grep(self, text: str) -> list[tuple[str, int, str]]:
        """Every `(path, line index, stripped line)` whose line contains `text`
        (case-insensitive), in path order."""
        needle = text.lower()
        return [(p, i, line.strip()) for p in sorted(self.files)
                for i, line in enumerate(self.files[p].split("\n")) if needle in line.lower()]


def make_repo(key: str, n_files: int) -> Repo:
    """The repository named `key` (any string: it seeds the generator) with `n_files` files."""
    if not MIN_FILES <= n_files <= MAX_FILES:
        raise ValueError(f"n_files must be in {MIN_FILES}..{MAX_FILES}, got {n_files}")
    rng = random.Random(f"locate-repo-{key}-{n_files}")
    paths = _repo_paths(rng, n_files)
    fns, defined_in, callee, message = _call_graph(rng, paths)
    files: dict[str, str] = {}
    for p in paths:
        lines = []
        for fn in fns:
            if defined_in[fn] != p:
                continue
            lines.append(f"def {fn}(x):")
            lines.append(f"    return {callee[fn]}(x)" if callee[fn] is not None
                         else f'    raise ValueError("{message[fn]}")')
        files[p] = "\n".join(lines)
    return Repo(files=files, dirs=_repo_dirs(paths), defined_in=defined_in, callee=callee,
                message=message, depth={fn: _depth(fn, callee) for fn in fns})


def _repo_paths(rng: random.Random, n_files: int) -> list[str]:
    """`n_files` file paths spread over package/module folders."""
    n_dirs = max(2, round(n_files / 4))
    n_pkgs = min(len(_PKGS), max(2, round(math.sqrt(n_dirs))))
    n_mods = min(len(_MODS), math.ceil(n_dirs / n_pkgs))
    folders = [f"{p}/{m}" for p in rng.sample(_PKGS, n_pkgs) for m in rng.sample(_MODS, n_mods)]
    names: dict[str, list[str]] = {f: [] for f in folders}
    pool = {f: list(rng.sample(_FILES, len(_FILES))) for f in folders}
    for i in range(n_files):
        f = folders[i % len(folders)]
        names[f].append(pool[f].pop())
    return [f"{f}/{n}.py" for f in folders for n in names[f]]


def _call_graph(rng: random.Random, paths: list[str]):
    """-> (functions, file each is defined in, the function each calls (None: a leaf), each
    leaf's error message): 2-3 functions per file, leaves first, the rest spread evenly over
    depths 2..MAX_HOPS (every depth non-empty)."""
    fn_names = [f"{v}_{n}" for v in _VERBS for n in _NOUNS]
    per_file = [rng.randint(2, 3) for _ in paths]
    fns = rng.sample(fn_names, sum(per_file))
    defined_in: dict[str, str] = {}
    it = iter(fns)
    for p, k in zip(paths, per_file):
        for _ in range(k):
            defined_in[next(it)] = p
    order = list(fns)
    rng.shuffle(order)
    n_leaves = max(2, round(len(order) * _LEAF_SHARE))
    depth = {fn: 1 for fn in order[:n_leaves]}
    for i, fn in enumerate(order[n_leaves:]):
        depth[fn] = 2 + i % (MAX_HOPS - 1)
    by_depth: dict[int, list[str]] = {}
    for fn in order:
        by_depth.setdefault(depth[fn], []).append(fn)
    callee: dict[str, str | None] = {}
    for fn in order:
        d = depth[fn]
        callee[fn] = None if d == 1 else rng.choice(by_depth[d - 1])
    leaves = by_depth[1]
    n_msgs = max(2, len(leaves) // _PER_MESSAGE)
    msgs = rng.sample([f"{a} {o}" for a in _ADJS for o in _OBJS], n_msgs)
    message = {fn: msgs[i % n_msgs] for i, fn in enumerate(leaves)}
    return fns, defined_in, callee, message


def _repo_dirs(paths: list[str]) -> dict[str, tuple[str, ...]]:
    """Folder -> its sorted entries (subfolders with a trailing '/')."""
    dirs: dict[str, set[str]] = {"": set()}
    for p in paths:
        parts = p.split("/")
        for i in range(len(parts) - 1):
            parent = "/".join(parts[:i])
            dirs.setdefault(parent, set()).add(parts[i] + "/")
            dirs.setdefault("/".join(parts[:i + 1]), set())
        dirs["/".join(parts[:-1])].add(parts[-1])
    return {d: tuple(sorted(e)) for d, e in dirs.items()}


def _depth(fn: str, callee: dict[str, str | None]) -> int:
    d = 1
    while callee[fn] is not None:
        fn, d = callee[fn], d + 1
    return d


@functools.lru_cache(maxsize=256)   # about 80 KB per 100-file repository
def _repo(key: str, n_files: int) -> Repo:
    return make_repo(key, n_files)


def resolve_path(path: str) -> str | None:
    """The repository-relative form of `path` ("" for the root), or None when it is absolute,
    has a `..` component, or is otherwise outside the repository."""
    p = path.strip()
    if p.startswith(("/", "~")) or "\\" in p or re.match(r"^[A-Za-z]:", p):
        return None
    parts = [x for x in p.split("/") if x not in ("", ".")]
    if ".." in parts:
        return None
    return "/".join(parts)


# ------------------------------------------------------------------------------ tasks
def _task(split: str, i: int, key: str, repo: Repo, entry: str) -> Task:
    """The issue "<entry> fails with <message>" over repository `key`; the gold file defines the
    last function of `entry`'s call chain (the one that raises)."""
    chain = repo.chain(entry)
    msg = repo.message[chain[-1]]
    meta = {"hops": len(chain), "repo": key, "n_files": len(repo.files), "chain": chain,
            "chain_files": [repo.defined_in[fn] for fn in chain], "message": msg,
            "raised_in": sorted({repo.defined_in[fn] for fn, m in repo.message.items()
                                 if m == msg})}
    return Task(task_id=f"locate-{split}-{i:05d}", prompt=f'Issue: {entry} fails with "{msg}".',
                answer=repo.defined_in[chain[-1]], meta=meta)


@functools.lru_cache(maxsize=16)
def _tasks(seed: int, n_files: int, min_hops: int, max_hops: int, n_train: int,
           n_eval: int, repos: str = "per-task") -> dict[str, tuple[Task, ...]]:
    if repos == "shared":
        return _shared_tasks(seed, n_files, min_hops, max_hops, n_train, n_eval)
    return {split: _split_tasks(seed, n_files, min_hops, max_hops, split, n)
            for split, n in (("train", n_train), ("eval", n_eval))}


@functools.lru_cache(maxsize=32)
def _split_tasks(seed: int, n_files: int, min_hops: int, max_hops: int, split: str,
                 n: int) -> tuple[Task, ...]:
    """The first `n` tasks of a split with per-task repositories: task i depends on its split
    and index only (its own repository), so a split is made without the other and a prefix
    without the rest (10,000 training repositories take about 15 s; an eval needs none)."""
    tasks = []
    for i in range(n):
        key = f"{seed}-{split}-{i}"
        repo = _repo(key, n_files)
        rng = random.Random(f"locate-task-{key}-{n_files}-{min_hops}-{max_hops}")
        hops = rng.randint(min_hops, max_hops)
        entry = rng.choice(sorted(fn for fn, d in repo.depth.items() if d == hops))
        tasks.append(_task(split, i, key, repo, entry))
    return tuple(tasks)


def _shared_tasks(seed: int, n_files: int, min_hops: int, max_hops: int, n_train: int,
                  n_eval: int) -> dict[str, tuple[Task, ...]]:
    """`env.repos=shared`: every task over one repository (LocBench's issues share
    repositories too), one task per entry function whose call chain is min_hops..max_hops long.
    The entry functions are shuffled and split: held-out tasks get min(n_eval, a quarter of
    them), training tasks at most n_train of the rest; no entry function is in both."""
    key = f"{seed}-shared"
    repo = _repo(key, n_files)
    entries = sorted(fn for fn, d in repo.depth.items() if min_hops <= d <= max_hops)
    random.Random(f"locate-shared-{seed}-{n_files}-{min_hops}-{max_hops}").shuffle(entries)
    n_ev = min(n_eval, len(entries) // 4)
    splits = {"eval": entries[:n_ev], "train": entries[n_ev:n_ev + n_train]}
    return {split: tuple(_task(split, i, key, repo, fn) for i, fn in enumerate(fns))
            for split, fns in splits.items()}


# ------------------------------------------------------------------------------ env
NO_RESULT = "error: no result {n} in the latest ls or grep"


def _numbered(entries: list[str], sep: str) -> str:
    return sep.join(f"[{i}] {e}" for i, e in enumerate(entries, 1))


class LocateEnv(CallEnv):
    """One episode at a time over its task's repository: `ls`, `grep`, `open` and `answer`
    (see `CallEnv` for the bookkeeping). A history entry also holds the resolved `path` of an
    `ls` / `open` (None otherwise) and, for an `ls` or `grep` that ran, its `listing`: the
    paths its numbered results name (a tuple; None for other steps), and for a `grep` its
    results' line indexes (`lines`). An answer's `info` holds Acc@1 and Acc@5."""

    system_prompt = SYSTEM_PROMPT
    tools = TOOLS
    malformed = MALFORMED
    failed_info = {"success": False, "acc@1": 0.0, "acc@5": 0.0}

    def _load(self) -> None:
        # the repository is rebuilt (cached) from the task, never snapshotted; the numbered
        # results live in the history, so a restored state refers to its own
        self._built_repo: Repo | None = None
        self._new_listing: tuple[str, ...] | None = None
        self._new_lines: tuple[int, ...] | None = None

    @property
    def repo(self) -> Repo | None:
        """The task's repository, made on its first use (a reset alone, such as the prompt
        checks before a run, does not build 10,000 of them)."""
        if getattr(self, "_built_repo", None) is None and self.task is not None:
            self._built_repo = _repo(self.task.meta["repo"], self.task.meta["n_files"])
        return getattr(self, "_built_repo", None)

    def _latest(self) -> dict | None:
        """The history entry of the latest `ls` or `grep` that ran (None before any)."""
        return next((h for h in reversed(self.history) if h["listing"] is not None), None)

    def listing(self) -> tuple[str, ...]:
        """The paths the latest `ls` or `grep` numbered (empty before any)."""
        latest = self._latest()
        return () if latest is None else latest["listing"]

    def _hit_line(self, arg: str) -> int:
        """The line index of the `grep` result `arg` names (0: not a grep result number)."""
        latest, text = self._latest(), arg.strip()
        if latest is None or not latest["lines"] or not text.isdigit():
            return 0
        n = int(text)
        return latest["lines"][n - 1] if 1 <= n <= len(latest["lines"]) else 0

    def resolve(self, arg: str) -> tuple[str | None, str | None]:
        """`(path, None)` for a repository path or a result number, `(None, observation)` when
        the path is outside the repository or the number names no result."""
        text = arg.strip()
        if text.isdigit():
            found = self.listing()
            n = int(text)
            if 1 <= n <= len(found):
                return found[n - 1], None
            return None, NO_RESULT.format(n=n)
        path = resolve_path(text)
        return (path, None) if path is not None else (None, OUTSIDE)

    def _ls(self, arg: str) -> tuple[str, bool]:
        path, why = self.resolve(arg)
        if path is None:
            return why, True
        if path in self.repo.dirs:
            entries = list(self.repo.dirs[path])
            self._new_listing = tuple(f"{path}/{e}".strip("/") if path else e.rstrip("/")
                                      for e in entries)
            return _numbered(entries, " ") or "(empty)", False
        if path in self.repo.files:
            self._new_listing = (path,)
            return _numbered([path], " "), False
        return f"error: no such path {arg}", True

    def _open(self, arg: str) -> tuple[str, bool]:
        path, why = self.resolve(arg)
        if path is None:
            return why, True
        if path in self.repo.files:
            line = self._hit_line(arg)
            if line:
                lines = self.repo.files[path].split("\n")
                return "\n".join(lines[line:] + [f"({line} lines above)"]), False
            return self.repo.files[path], False
        if path in self.repo.dirs:
            return f"error: {arg} is a folder", True
        return f"error: no file {arg}", True

    def _grep(self, arg: str) -> tuple[str, bool]:
        if not arg:
            return "error: empty pattern", True
        hits = self.repo.grep(arg)
        shown = hits[:GREP_HITS]
        self._new_listing = tuple(p for p, _, _ in shown)
        self._new_lines = tuple(i for _, i, _ in shown)
        if not hits:
            return "no matches", False
        extra = len(hits) - GREP_HITS
        return (_numbered([f"{p}: {text}" for p, _, text in shown], "\n")
                + (f"\n({extra} more)" if extra > 0 else "")), False

    def _tool(self, tool: str, arg: str) -> tuple[str, bool]:
        if tool == "ls":
            return self._ls(arg)
        if tool == "open":
            return self._open(arg)
        return self._grep(arg)

    def ranked(self, arg: str) -> list[str | None]:
        """Files of an answer, best first (paths or result numbers), duplicates dropped;
        refused paths and numbers with no result stay as None."""
        out: list[str | None] = []
        for part in re.split(r"[,\s]+", arg.strip()):
            if part:
                p = self.resolve(part.strip("\"'"))[0]
                if p is None or p not in out:
                    out.append(p)
        return out

    def _answer(self, arg: str) -> dict[str, Any]:
        ranked = self.ranked(arg)
        gold = self.task.answer
        acc1 = float(bool(ranked) and ranked[0] == gold)
        acc5 = float(gold in ranked[:5])
        return {"success": acc1 == 1.0, "acc@1": acc1, "acc@5": acc5}

    def _record(self, action: str, tool: str | None, arg: str, obs: str,
                error: bool) -> dict[str, Any]:
        # runs before the entry joins the history: a number resolves against the listing
        # the call saw
        path = self.resolve(arg)[0] if tool in ("ls", "open") else None
        listing, self._new_listing = self._new_listing, None
        lines, self._new_lines = self._new_lines, None
        return {"action": action, "tool": tool, "arg": arg, "path": path,
                "observation": obs, "error": error, "listing": listing, "lines": lines}


def _same(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def _ref(env: LocateEnv, path: str) -> str:
    """The number of `path` in the latest numbered results, else the path itself."""
    found = env.listing()
    return str(found.index(path) + 1) if path in found else path


def _expert_action(env: LocateEnv, rng: random.Random, error_rate: float) -> str:
    """Replay the history to find how far along the call chain the expert is, then act."""
    task = env.task
    if task is None:
        return "ls(.)"
    chain, files, msg = task.meta["chain"], task.meta["chain_files"], task.meta["message"]
    k = 0                              # chain functions whose body has been read
    for h in env.history:
        if h["tool"] == "open" and not h["error"]:
            while k < len(chain) and files[k] == h["path"]:
                k += 1
    if k >= len(chain):
        return f"answer({_ref(env, task.answer)})"
    last = env.history[-1] if env.history else None
    if last is not None and last["tool"] == "grep" and not last["error"]:
        if _same(last["arg"], f"def {chain[k]}"):
            return f"open({_ref(env, files[k])})"
        if error_rate > 0 and _same(last["arg"], msg) and last["observation"] != "no matches":
            ranked = list(dict.fromkeys(last["listing"]))
            rng.shuffle(ranked)
            return f"answer({', '.join(_ref(env, p) for p in ranked[:5])})"
    if error_rate > 0 and rng.random() < error_rate:
        return f"grep({msg})"
    return f"grep(def {chain[k]})"


class LocateSpec:
    """The "locate" env spec: deterministic train/eval tasks (one repository each), the expert."""

    name = "locate"
    tool_schemas = TOOL_SCHEMAS
    tools_system_prompt = TOOLS_SYSTEM_PROMPT

    def __init__(self, seed: int = 0, n_files: int = 48, min_hops: int = 2, max_hops: int = 3,
                 n_train: int = 600, n_eval: int = 200, max_turns: int = 12,
                 repos: str = "per-task", call_cost: float = 0.0):
        if not 1 <= min_hops <= max_hops:
            raise ConfigError(f"locate: need 1 <= env.min_hops <= env.max_hops, "
                              f"got {min_hops}..{max_hops}")
        if max_hops > MAX_HOPS:
            raise ConfigError(f"locate: env.max_hops must be at most {MAX_HOPS}, got {max_hops}")
        if not MIN_FILES <= n_files <= MAX_FILES:
            raise ConfigError(f"locate: n_files (env.n_entities) must be in "
                              f"{MIN_FILES}..{MAX_FILES}, got {n_files}")
        if n_train < 0 or n_eval < 0:
            raise ConfigError("locate: env.n_train and env.n_eval must be non-negative")
        if repos not in ("per-task", "shared"):
            raise ConfigError(f"locate: env.repos must be per-task or shared, got '{repos}'")
        self.repos = repos
        self.seed, self.n_files = int(seed), int(n_files)
        self.min_hops, self.max_hops = int(min_hops), int(max_hops)
        self.n_train, self.n_eval, self.max_turns = int(n_train), int(n_eval), int(max_turns)
        self.call_cost = check_call_cost(call_cost)

    def make(self) -> LocateEnv:
        return LocateEnv(self.max_turns, self.call_cost)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in ("train", "eval"):
            raise ConfigError(f"unknown split '{split}'; valid: train, eval")
        size = self.n_train if split == "train" else self.n_eval
        if self.repos == "per-task":     # only the split asked for, only as far as asked
            return list(_split_tasks(self.seed, self.n_files, self.min_hops, self.max_hops,
                                     split, size if n is None else max(0, min(n, size))))
        all_tasks = _tasks(self.seed, self.n_files, self.min_hops, self.max_hops,
                           self.n_train, self.n_eval, self.repos)[split]
        return list(all_tasks if n is None else all_tasks[:n])

    def expert(self, env: LocateEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """Per function of the call chain: `grep(def <function>)`, then `open(N)` (N: its file's
        number among the results) to read which function it calls (or the error it raises);
        finally `answer(N)` (or the path, when the latest results do not hold it). With
        `error_rate` e, before each grep the expert takes a shortcut with probability e: it
        greps the error message and answers every file that raises it, in random order (Acc@5
        is then 1, Acc@1 about 1/3)."""
        return _expert_action(env, rng, error_rate)


@env_factory("locate", ("n_files", "n_entities", "min_hops", "max_hops", "n_train", "n_eval",
                         "max_turns", "repos", "call_cost"))
def make_locate_spec(seed: int = 0, n_entities: int | None = None, **options: Any) -> LocateSpec:
    """Registry factory. Options: n_files (files per repository, 8-200; `n_entities`, the
    generic env-config size, is used when n_files is not given), min_hops, max_hops (functions
    on the call chain, 1-5), n_train, n_eval, max_turns, repos ("per-task" | "shared"),
    call_cost (`CallEnv`)."""
    if n_entities is not None:
        options.setdefault("n_files", n_entities)
    return LocateSpec(seed, **options)


ENVS.register("locate", make_locate_spec)
