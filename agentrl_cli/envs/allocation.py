"""The built-in "allocation" env: a repository walk where EARLY choices decide the outcome.

LocBench's task made so that one folder decision matters and the others do not, to study where
credit from branching at states (FOCUS) pays. The agent walks a repository of folders to the
file to fix: `horizon` folder decisions, then the answer. Every folder's entries are listed by
number, and an entry is named by its name or its number: actions stay short (the tiny model
cannot copy long strings). With horizon 3 and the second decision decisive:

    user:      Issue: router fails in pay.
               1 lib/ 2 internal/ 3 contrib/ 4 src/
    assistant: cd(internal)       tool: 1 pay2/ 2 jobs/ 3 pay/ 4 cache/
    assistant: cd(pay2)           tool: 1 src/ 2 lib/ 3 app/ 4 vendor/
    assistant: cd(app)            tool: 1 pool.py 2 loader.py 3 router.py 4 parser.py
    assistant: answer(router.py)  -> reward 1 (0 when the late noise strikes)

Exactly one decision, the `decisive`-th (1-based), matters: its entries are area folders,
`ambiguity` of them named after the issue's area (`pay/`, `pay2/`), and only one of those leads
to the file. At every other decision all entries lead on equally, and their listings are the
same in every task (`level_dirs`: nothing to read there). The file is in the leaf folder below
the right decisive entry (the one `.py` entry named in the issue); the leaf below a wrong one
lists no such file, which is the only way to tell a wrong decisive choice, `horizon - decisive`
decisions later.

Tools (the whole assistant message is exactly one call, `calls.parse_call`); ENTRY is a listed
entry's name (a folder's `/` and a file's `.py` may be left out; any case) or its number:
  cd(ENTRY)      enter a listed folder -> its listing
  back()         (only with `recoverable`) undo the last cd -> the parent's listing; one turn
                 each, so a wrong decisive trial costs 2 * (horizon - decisive + 1) turns: down
                 to the leaf, back up
  answer(ENTRY)  the listed file is the one to fix; ends the episode. Success: the leaf below
                 the right decisive entry, the file named in the issue, and the late noise did
                 not strike
A malformed message, an entry not listed, `cd` of a file, `answer` of a folder and `back()` at
the top are error observations; the episode goes on (truncated after `max_turns` messages).

Options (`make_allocation_spec`): horizon (folder decisions, 1-8), decisive (which one matters,
1..horizon), width (entries per folder, 2-9), ambiguity (decisive entries matching the issue,
1..width: a perfect reader still guesses among them), recoverable (the `back()` tool),
late_noise (probability in [0, 1) that a correct answer still fails), files (files listed at a
leaf, 1..width, default width: with 1 the answer needs no reading, only the decisive choice
does), n_train, n_eval,
max_turns, call_cost (`CallEnv`'s: a correct answer earns 1 less this per message before it),
expert_refs (how the scripted expert names an entry: `name`, the default, or `number`, its
listed number; the world and the tools are the same either way).

The late noise is independent of the agent's reading: a correct answer fails when
`random.Random("allocation-noise-<task's noise seed>-<route>").random() < late_noise`, the
route being the episode's sequence of accepted moves (`c3`, `b`, ...). It is a per-task seeded
stream keyed by the state, so a fork restored from a snapshot gives the same outcome as the
original under the same messages, while different routes (e.g. other choices at the decisions
that do not matter) draw independently.

Oracle value (`AllocationEnv.oracle_value()`): the probability that the episode still succeeds
under perfect play from the current state, the world (which decisive entry is right) as it is
and the late noise as the coin it is. Perfect play is the scripted expert at error rate 0: a
perfect reader who sees only what the agent saw. It picks uniformly among the decisive
entries that match the issue and are not refuted (an entry is refuted once the leaf below it
was listed without the file; once the right leaf was listed, only that entry), walks down
choosing anything at the other decisions, answers the file at the right leaf, and, when
`recoverable`, backs out of a decisive entry it knows is wrong (not matching, or refuted) and
tries the next one. Let L = horizon - decisive + 1 (the decisions from the decisive one down),
T the turns left (max_turns - messages so far) and q = 1 - late_noise:
  * an ended episode: 1 if it succeeded, else 0;
  * below a decisive choice c (depth >= decisive): on the right track, q when the remaining
    `horizon - depth` cds and the answer fit in T, else 0. On a wrong track, 0 without
    `recoverable` (doomed); with it, the turns to get back above the decisive decision (the
    backs, after first walking down to the leaf if c is not yet known to be wrong) are spent
    and the value is that of the candidates left, below;
  * above the decisive decision (depth < decisive) with n candidates (matching, not refuted)
    and the decisive decision `decisive - 1 - depth` cds away: the right entry is equally
    likely to be tried j-th, j = 1..n; trying it j-th takes (j - 1) * 2L failed trials' turns
    plus L + 1, and only j = 1 without `recoverable`. The value is q * (the number of j whose
    turns fit in T) / n: at the root with enough turns, q / ambiguity without recovery.
The empirical check is tests/test_env_allocation.py: the root values' mean matches the
success rate of the expert's play over many tasks.

Everything is deterministic from the seed (`random.Random`, never the global RNG).
"""
from __future__ import annotations

import functools
import random
from typing import Any

from ..errors import ConfigError
from .base import ENVS, StepResult, Task, env_factory
from .calls import check_call_cost, parse_call
from .tool_calls import function_tool

__all__ = [
    "AllocationEnv",
    "AllocationSpec",
    "MALFORMED",
    "make_allocation_spec",
    "noise_strikes",
    "root_value",
]

MAX_HORIZON = 8
MAX_WIDTH = 9                    # entries are numbered with one digit
_PROMPT = "Find the file to fix. One call per message: cd(folder), answer(file)."
_PROMPT_BACK = "Find the file to fix. One call per message: cd(folder), back(), answer(file)."
MALFORMED = "error: use cd(folder) or answer(file)"
MALFORMED_BACK = "error: use cd(folder), back() or answer(file)"
_TOOLS_PROMPT = "Find the file to fix using the tools, one call per message; end with answer."

_AREAS = ("auth", "db", "net", "api", "cache", "jobs", "mail", "ui", "pay", "search", "log",
          "admin")
_DIRS = ("src", "lib", "pkg", "app", "common", "shared", "internal", "vendor", "tools",
         "modules", "contrib", "plugins")
_FILES = ("parser", "loader", "router", "schema", "client", "server", "handler", "session",
          "tokens", "worker", "queue", "cursor", "codec", "filter", "index", "pool")


def _tool_schemas(recoverable: bool) -> tuple[dict, ...]:
    entry = ("integer", "an entry's number in the current listing")
    tools = [function_tool("cd", "Enter the n-th listed folder; returns its entries.", n=entry)]
    if recoverable:
        tools.append(function_tool("back", "Go back to the parent folder; returns its entries."))
    tools.append(function_tool("answer", "The n-th listed file is the one to fix; ends the "
                                         "episode.", n=entry))
    return tuple(tools)


def listing(names: list[str] | tuple[str, ...]) -> str:
    """A folder's entries as the agent sees them: `1 src/ 2 lib/ ...`."""
    return " ".join(f"{i} {n}" for i, n in enumerate(names, 1))


def noise_strikes(noise_seed: int, route: list[str], late_noise: float) -> bool:
    """Whether the late noise fails a correct answer given along `route` (see the module
    docstring): a draw of the task's seeded stream keyed by the route."""
    if late_noise <= 0.0:
        return False
    u = random.Random(f"allocation-noise-{noise_seed}-{','.join(route)}").random()
    return u < late_noise


# ------------------------------------------------------------------------------ tasks
def level_dirs(level: int, width: int) -> list[str]:
    """The entries of a decision that does not matter: the same at level `level` in every
    task (nothing there to read, so a small model spends nothing on predicting them)."""
    return [d + "/" for d in random.Random(f"allocation-level-{level}").sample(_DIRS, width)]


def _task(split: str, i: int, key: str, horizon: int, decisive: int, width: int,
          ambiguity: int, files: int) -> Task:
    rng = random.Random(f"allocation-task-{key}")
    area = rng.choice(_AREAS)
    others = rng.sample([a for a in _AREAS if a != area], width - ambiguity)
    names = [area + (str(j + 1) if j else "") + "/" for j in range(ambiguity)]
    names += [o + "/" for o in others]
    order = list(range(width))
    rng.shuffle(order)
    decisive_names = [names[j] for j in order]
    matching = [n + 1 for n, j in enumerate(order) if j < ambiguity]
    gold = rng.choice(matching)
    levels = [decisive_names if level == decisive else level_dirs(level, width)
              for level in range(1, horizon + 1)]
    word = rng.choice(_FILES)
    rest = [f for f in _FILES if f != word]
    leaf = rng.sample(rest, files - 1)
    gold_file = rng.randint(1, files)
    leaf.insert(gold_file - 1, word)
    wrong_leaves = [None if c == gold else [f + ".py" for f in rng.sample(rest, files)]
                    for c in range(1, width + 1)]
    noise_seed = rng.getrandbits(32)
    meta = {"hops": horizon, "horizon": horizon, "decisive": decisive, "width": width,
            "area": area, "file": word + ".py", "matching": matching, "gold": gold,
            "levels": levels, "leaf": [f + ".py" for f in leaf], "gold_file": gold_file,
            "wrong_leaves": wrong_leaves, "noise_seed": noise_seed}
    prompt = f"Issue: {word} fails in {area}.\n{listing(levels[0])}"
    return Task(task_id=f"allocation-{split}-{i:05d}", prompt=prompt, answer=str(gold_file),
                meta=meta)


@functools.lru_cache(maxsize=16)
def _tasks(seed: int, horizon: int, decisive: int, width: int, ambiguity: int, n_train: int,
           n_eval: int, files: int | None = None) -> dict[str, tuple[Task, ...]]:
    files = width if files is None else files
    # files == width keeps the tasks drawn before the option existed
    shape = f"{horizon}-{decisive}-{width}-{ambiguity}" + (f"-f{files}" if files != width else "")
    return {split: tuple(_task(split, i, f"{seed}-{split}-{i}-{shape}", horizon, decisive,
                               width, ambiguity, files) for i in range(n))
            for split, n in (("train", n_train), ("eval", n_eval))}


# ------------------------------------------------------------------------------ the value
def _trials_value(n: int, turns: int, span: int, recoverable: bool, q: float) -> float:
    """From just above the decisive decision with `n` candidates (the right one among them,
    equally likely to be tried at each position) and `turns` left: q times the share of
    positions j whose trial fits, trying j-th costing (j - 1) * 2 * span + span + 1 turns."""
    if n <= 0:
        return 0.0
    tries = n if recoverable else 1
    fit = sum(1 for j in range(1, tries + 1) if (j - 1) * 2 * span + span + 1 <= turns)
    return q * fit / n


def root_value(horizon: int, decisive: int, ambiguity: int, recoverable: bool,
               late_noise: float, max_turns: int) -> float:
    """`oracle_value()` of a fresh episode (every task of a setting has the same one)."""
    span = horizon - decisive + 1
    return _trials_value(ambiguity, max_turns - (decisive - 1), span, recoverable,
                         1.0 - late_noise)


# ------------------------------------------------------------------------------ env
class AllocationEnv:
    """One episode at a time: the folder path chosen so far (`path`, entry numbers), the
    accepted moves (`route`), what the agent learnt about the decisive entries (`refuted`,
    `confirmed`), turns and end flags. Implements the TextEnv protocol."""

    def __init__(self, max_turns: int = 12, recoverable: bool = False, late_noise: float = 0.0,
                 call_cost: float = 0.0):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.max_turns = max_turns
        self.recoverable = bool(recoverable)
        self.late_noise = float(late_noise)
        self.call_cost = check_call_cost(call_cost)
        self.system_prompt = _PROMPT_BACK if self.recoverable else _PROMPT
        self.malformed = MALFORMED_BACK if self.recoverable else MALFORMED
        self.tools = ("cd", "back", "answer") if self.recoverable else ("cd", "answer")
        self.task: Task | None = None
        self.path: list[int] = []
        self.route: list[str] = []
        self.refuted: list[int] = []     # decisive entries whose leaf was listed without the file
        self.confirmed = False           # the right leaf was listed
        self.steps = 0
        self.terminated = False
        self.truncated = False
        self.succeeded = False

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    # ---- the world -------------------------------------------------------------------------
    @property
    def meta(self) -> dict:
        return self.task.meta

    def on_track(self) -> bool:
        """Whether the decisive choice, if made, is the right one (True above it)."""
        d = self.meta["decisive"]
        return len(self.path) < d or self.path[d - 1] == self.meta["gold"]

    def entries(self) -> list[str]:
        """The current folder's entries (files at the leaf)."""
        m, depth = self.meta, len(self.path)
        if depth < m["horizon"]:
            return m["levels"][depth]
        if self.on_track():
            return m["leaf"]
        return m["wrong_leaves"][self.path[m["decisive"] - 1] - 1]

    def _index(self, arg: str) -> int | None:
        """The listed entry `arg` names: its number, or its name (a folder's without the '/',
        a file's without '.py' too), case-insensitive; None when none."""
        arg = arg.strip().lower()
        entries = self.entries()
        if arg.isdigit():
            n = int(arg)
            return n if 1 <= n <= len(entries) else None
        for n, name in enumerate(entries, 1):
            stem = name.rstrip("/")
            if arg in (name, stem) or (stem.endswith(".py") and arg == stem[:-3]):
                return n
        return None

    def _unknown(self, arg: str) -> str:
        return (f"error: no entry {arg.strip()[:20]!r} here; give its name or its number, "
                f"1-{len(self.entries())}")

    # ---- protocol --------------------------------------------------------------------------
    def reset(self, task: Task) -> str:
        self.task = task
        self.path, self.route, self.refuted = [], [], []
        self.confirmed = self.terminated = self.truncated = self.succeeded = False
        self.steps = 0
        return task.prompt

    def _move(self, tool: str, arg: str) -> tuple[str, bool]:
        m = self.meta
        horizon = m["horizon"]
        if tool == "back":
            if arg:
                return "error: back() takes no argument", True
            if not self.path:
                return "error: already at the top", True
            self.path.pop()
            self.route.append("b")
            return listing(self.entries()), False
        n = self._index(arg)
        if n is None:
            return self._unknown(arg), True
        if len(self.path) >= horizon:
            return f"error: {self.entries()[n - 1]} is a file; answer(...) gives it", True
        self.path.append(n)
        self.route.append(f"c{n}")
        if len(self.path) == horizon:              # a leaf listed: it tells right from wrong
            c = self.path[m["decisive"] - 1]
            if c == m["gold"]:
                self.confirmed = True
            elif c not in self.refuted:
                self.refuted = sorted(self.refuted + [c])
        return listing(self.entries()), False

    def _answer(self, arg: str) -> tuple[str, bool, dict]:
        m = self.meta
        if len(self.path) < m["horizon"]:
            return "error: these are folders; cd into one, answer a file", True, {}
        n = self._index(arg)
        if n is None:
            return self._unknown(arg), True, {}
        right = self.on_track() and n == m["gold_file"]
        noise = right and noise_strikes(m["noise_seed"], self.route, self.late_noise)
        return "", False, {"success": right and not noise, "answer": self.entries()[n - 1],
                           "right_file": right, "late_noise": noise}

    def step(self, action: str) -> StepResult:
        if self.task is None or self.done:
            why = "call reset() first" if self.task is None else "the episode is over"
            return StepResult(f"error: {why}", 0.0, self.terminated, self.truncated,
                              {"tool": None, "error": True, "success": False})
        self.steps += 1
        parsed = parse_call(action, self.tools)
        tool, arg = parsed if parsed is not None else (None, "")
        info: dict[str, Any] = {"tool": tool}
        reward, terminated = 0.0, False
        if tool is None:
            obs, error = self.malformed, True
        elif tool == "answer":
            obs, error, extra = self._answer(arg)
            if not error:
                info.update(extra)
                terminated = True
                self.succeeded = extra["success"]
                reward = (max(0.0, 1.0 - self.call_cost * (self.steps - 1))
                          if self.succeeded else 0.0)
        else:
            obs, error = self._move(tool, arg)
        truncated = not terminated and self.steps >= self.max_turns
        if truncated:
            info["success"] = False
        info["error"] = error
        info["steps"] = self.steps
        self.terminated, self.truncated = terminated, truncated
        return StepResult(obs, reward, terminated, truncated, info)

    def snapshot(self) -> Any:
        """The state as an independent copy (the task shared: a frozen `Task`)."""
        return {"task": self.task, "path": list(self.path), "route": list(self.route),
                "refuted": list(self.refuted), "confirmed": self.confirmed, "steps": self.steps,
                "terminated": self.terminated, "truncated": self.truncated,
                "succeeded": self.succeeded, "max_turns": self.max_turns}

    def restore(self, state: Any) -> None:
        s = state
        self.task, self.path, self.route = s["task"], list(s["path"]), list(s["route"])
        self.refuted, self.confirmed = list(s["refuted"]), s["confirmed"]
        self.steps, self.terminated, self.truncated = s["steps"], s["terminated"], s["truncated"]
        self.succeeded, self.max_turns = s["succeeded"], s["max_turns"]

    # ---- the oracle ------------------------------------------------------------------------
    def candidates(self) -> list[int]:
        """The decisive entries perfect play may still try: the right one once its leaf was
        listed, else those matching the issue and not refuted."""
        m = self.meta
        if self.confirmed:
            return [m["gold"]]
        return [c for c in m["matching"] if c not in self.refuted]

    def known_wrong(self) -> bool:
        """Below a decisive choice the agent can tell is wrong (not matching, or refuted)."""
        d = self.meta["decisive"]
        if len(self.path) < d:
            return False
        return self.path[d - 1] not in self.candidates()

    def oracle_value(self) -> float:
        """The probability that the episode still succeeds under perfect play from here (the
        module docstring defines it)."""
        if self.task is None:
            return 0.0
        if self.done:
            return 1.0 if self.succeeded else 0.0
        m = self.meta
        horizon, d = m["horizon"], m["decisive"]
        span = horizon - d + 1
        q = 1.0 - self.late_noise
        depth, turns = len(self.path), self.max_turns - self.steps
        if depth < d:
            return _trials_value(len(self.candidates()), turns - (d - 1 - depth), span,
                                 self.recoverable, q)
        if self.on_track():
            return q if horizon - depth + 1 <= turns else 0.0
        if not self.recoverable:
            return 0.0
        backs = depth - (d - 1)
        if self.known_wrong():
            cost = backs
        else:                           # walk down to the leaf first, which refutes it
            cost = (horizon - depth) + span
        left = [c for c in self.candidates() if c != self.path[d - 1]]
        return _trials_value(len(left), turns - cost, span, True, q)


def _expert_action(env: AllocationEnv, rng: random.Random, error_rate: float,
                   refs: str = "name") -> str:
    """Perfect play's next message (`AllocationSpec.expert`), naming entries by name, or by
    their listed numbers with `refs` "number"."""
    if env.task is None:
        return "cd(1)"
    m = env.meta
    horizon, d, width = m["horizon"], m["decisive"], m["width"]
    depth = len(env.path)
    entries = env.entries()

    def name(n: int) -> str:
        return str(n) if refs == "number" else entries[n - 1].rstrip("/")

    if depth == horizon:
        if env.on_track():
            return f"answer({name(m['gold_file'])})"
        return "back()" if env.recoverable else f"answer({name(rng.randint(1, len(entries)))})"
    if depth >= d and env.recoverable and env.known_wrong():
        return "back()"
    if depth != d - 1:
        return f"cd({name(rng.randint(1, width))})"
    if error_rate > 0 and rng.random() < error_rate:
        wrong = [c for c in range(1, width + 1) if c not in m["matching"]]
        return f"cd({name(rng.choice(wrong or list(range(1, width + 1))))})"
    return f"cd({name(rng.choice(env.candidates()))})"


class AllocationSpec:
    """The "allocation" env spec: deterministic train/eval tasks, the expert, the oracle."""

    name = "allocation"
    reward_range = (0.0, 1.0)
    tools_system_prompt = _TOOLS_PROMPT

    def __init__(self, seed: int = 0, horizon: int = 4, decisive: int = 1, width: int = 4,
                 ambiguity: int = 2, recoverable: bool = False, late_noise: float = 0.1,
                 n_train: int = 600, n_eval: int = 200, max_turns: int = 12,
                 call_cost: float = 0.0, files: int | None = None, expert_refs: str = "name"):
        def whole(name: str, v: Any) -> int:
            if isinstance(v, bool) or not isinstance(v, int) and not (
                    isinstance(v, float) and v.is_integer()):
                raise ConfigError(f"allocation: env.{name} must be a whole number, got {v!r}")
            return int(v)

        horizon, decisive, width = whole("horizon", horizon), whole("decisive", decisive), \
            whole("width", width)
        ambiguity, max_turns = whole("ambiguity", ambiguity), whole("max_turns", max_turns)
        files = width if files is None else whole("files", files)
        n_train, n_eval = whole("n_train", n_train), whole("n_eval", n_eval)
        if not 1 <= horizon <= MAX_HORIZON:
            raise ConfigError(f"allocation: env.horizon must be in 1..{MAX_HORIZON}, got {horizon}")
        if not 1 <= decisive <= horizon:
            raise ConfigError(f"allocation: env.decisive must be in 1..horizon ({horizon}), "
                              f"got {decisive}")
        if not 2 <= width <= MAX_WIDTH:
            raise ConfigError(f"allocation: env.width must be in 2..{MAX_WIDTH}, got {width}")
        if not 1 <= ambiguity <= width:
            raise ConfigError(f"allocation: env.ambiguity must be in 1..width ({width}), "
                              f"got {ambiguity}")
        if not 1 <= files <= width:
            raise ConfigError(f"allocation: env.files must be in 1..width ({width}), got {files}")
        if isinstance(recoverable, str) and recoverable.lower() in ("true", "false"):
            recoverable = recoverable.lower() == "true"
        if not isinstance(recoverable, bool):
            raise ConfigError(f"allocation: env.recoverable must be true or false, got {recoverable!r}")
        if isinstance(late_noise, bool) or not isinstance(late_noise, (int, float)) \
                or not 0.0 <= late_noise < 1.0:
            raise ConfigError(f"allocation: env.late_noise must be in [0, 1), got {late_noise!r}")
        if max_turns < horizon + 1:
            raise ConfigError(f"allocation: env.max_turns ({max_turns}) must be at least "
                              f"horizon + 1 ({horizon + 1}): the cds and the answer")
        if n_train < 0 or n_eval < 0:
            raise ConfigError("allocation: env.n_train and env.n_eval must be non-negative")
        if expert_refs not in ("name", "number"):
            raise ConfigError(f"allocation: env.expert_refs must be name or number, got {expert_refs!r}")
        self.seed, self.horizon, self.decisive, self.width = int(seed), horizon, decisive, width
        self.ambiguity, self.recoverable, self.late_noise = ambiguity, recoverable, float(late_noise)
        self.files, self.expert_refs = files, expert_refs
        self.n_train, self.n_eval, self.max_turns = n_train, n_eval, max_turns
        self.call_cost = check_call_cost(call_cost)
        self.tool_schemas = _tool_schemas(recoverable)

    def make(self) -> AllocationEnv:
        return AllocationEnv(self.max_turns, self.recoverable, self.late_noise, self.call_cost)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in ("train", "eval"):
            raise ConfigError(f"unknown split '{split}'; valid: train, eval")
        all_tasks = _tasks(self.seed, self.horizon, self.decisive, self.width, self.ambiguity,
                           self.n_train, self.n_eval, self.files)[split]
        return list(all_tasks if n is None else all_tasks[:n])

    def root_value(self) -> float:
        """The oracle value of every task's first state (`root_value`)."""
        return root_value(self.horizon, self.decisive, self.ambiguity, self.recoverable,
                          self.late_noise, self.max_turns)

    def expert(self, env: AllocationEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """Perfect play (the oracle value's): at the decisive decision a uniform pick among the
        candidate entries (`AllocationEnv.candidates`), anything at the others, the file's
        number at the right leaf, and with `recoverable` `back()` out of a decisive entry known
        to be wrong. With `error_rate` e, each decisive pick misreads the issue with probability
        e: an entry not matching it (any entry when all match). Entries are named by name, or
        by their listed numbers with `expert_refs` "number" (`cd(3)`, `answer(1)`)."""
        return _expert_action(env, rng, error_rate, self.expert_refs)


@env_factory("allocation", ("horizon", "decisive", "width", "ambiguity", "recoverable",
                             "late_noise", "files", "n_train", "n_eval", "max_turns", "call_cost",
                             "expert_refs"))
def make_allocation_spec(seed: int = 0, **options: Any) -> AllocationSpec:
    """Registry factory. Options: horizon (1-8), decisive (1..horizon), width (2-9),
    ambiguity (1..width), recoverable, late_noise ([0, 1)), files (1..width), n_train, n_eval,
    max_turns, call_cost, expert_refs (name | number: how the scripted expert names entries)."""
    return AllocationSpec(seed, **options)


ENVS.register("allocation", make_allocation_spec)
