"""The built-in "search" env: BrowseComp-Plus in miniature.

A seeded world of fictitious entities (people, companies, cities, countries), one short document
per entity, a BM25 search tool and multi-hop questions such as
`Question: Zorblax Corp > founder > birthplace` ("the birthplace of the founder of Zorblax Corp").
Many entities have a similar-named distractor ("Zorblax Labs", "Mira Quell") with different facts,
so a search returns several plausible documents and names must be copied exactly.

Tools (the whole assistant message is exactly one call):
  search(QUERY)   -> top 3 documents, one line each: `d12 Zorblax Corp`
  open(DOC_ID)    -> the document: `Mira Quon. birthplace: Tellavin. employer: Quibbly Inc.`
  answer(TEXT)    -> ends the episode; reward 1.0 if TEXT names the gold entity, else 0.0

Everything is deterministic from the seed (`random.Random(seed)`, never the global RNG).
"""
from __future__ import annotations

import functools
import math
import random
import re
import string
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .base import ENVS, Task, env_factory
from .calls import CallEnv, check_call_cost
from .tool_calls import function_tool

__all__ = [
    "Doc",
    "SearchWorld",
    "SearchEnv",
    "SearchSpec",
    "make_search_spec",
    "parse_action",
    "normalize_answer",
    "RELATIONS",
    "SYSTEM_PROMPT",
    "MALFORMED",
]

SYSTEM_PROMPT = (
    "Answer the question using tools, one call per message: "
    "search(query), open(doc_id), answer(text)."
)
MALFORMED = "error: use search(query), open(doc_id) or answer(text)"
# the tools as JSON schemas, for models that call tools in their own format (model.tool_format)
TOOL_SCHEMAS = (
    function_tool("search", "Search the documents; returns the top 3, one `doc_id title` per line.",
                  query=("string", "words to search for, e.g. an entity's name")),
    function_tool("open", "Open a document; returns its text.",
                  doc_id=("string", "a document id from a search result, e.g. d12")),
    function_tool("answer", "Give the final answer; ends the episode.",
                  text=("string", "the answer: an entity's name, copied exactly")),
)
TOOLS_SYSTEM_PROMPT = "Answer the question using the tools, one call per message; end with answer."
TOP_K = 3

# kind -> ordered relations (attribute name -> kind of its value)
RELATIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "person": (("birthplace", "city"), ("employer", "company")),
    "company": (("founder", "person"), ("ceo", "person"), ("hq", "city")),
    "city": (("country", "country"),),
    "country": (),
}
# Layered on purpose: no person->person or country->city relation, so a chain rarely repeats a
# relation and the next hop is the one fact of the opened document whose name appears in the
# question. That keeps the env learnable by a ~1M-parameter model in minutes on a CPU.
# "single": one outgoing relation per kind, so the next hop is the one fact a document states.
# The question still names every relation. The tiny built-in agent uses this variant: it
# leaves copying names and ids and choosing among search results as the skills to learn.
RELATION_SETS: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "full": RELATIONS,
    "single": {"person": (("employer", "company"),), "company": (("hq", "city"),),
               "city": (("country", "country"),), "country": ()},
}
_KIND_SHARE = (("person", 0.40), ("company", 0.25), ("city", 0.25), ("country", 0.10))

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "dr", "kr", "tr", "gl", "pl", "sh", "qu", "j")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "", "n", "r", "l", "x", "s", "m", "th")
_COMPANY_SUFFIXES = ("Corp", "Labs", "Inc", "Group", "Works", "Systems")
_CITY_AFFIXES = (("Port ", ""), ("New ", ""), ("", " Falls"), ("", " Bay"), ("", " Heights"))
_COUNTRY_AFFIXES = (("North ", ""), ("South ", ""), ("Upper ", ""), ("", " Minor"))
_RESERVED = {"search", "open", "answer", "question", "error", "no", "document", "results"}
_RESERVED |= {r for rels in RELATIONS.values() for r, _ in rels}

_TOKEN = re.compile(r"[a-z0-9]+")
_CALL = re.compile(r"^(search|open|answer)\((.*)\)$", re.DOTALL)
_DOC_ID = re.compile(r"^d\d+$")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def normalize_answer(text: str) -> str:
    """Lowercase, collapse whitespace, strip punctuation/whitespace at both ends."""
    return " ".join(text.lower().split()).strip(string.punctuation + string.whitespace)


def parse_action(action: str) -> tuple[str, str] | None:
    """`(tool, argument)` for a message that is exactly one call, else None.

    The argument is stripped (and one pair of surrounding quotes removed); an argument containing
    parentheses or a newline is rejected (that is how two calls in one message are caught)."""
    if not isinstance(action, str):
        return None
    m = _CALL.match(action.strip())
    if m is None:
        return None
    tool, arg = m.group(1), m.group(2).strip()
    if "(" in arg or ")" in arg or "\n" in arg:
        return None
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "\"'":
        arg = arg[1:-1].strip()
    return tool, arg


@dataclass(frozen=True)
class Doc:
    doc_id: str
    title: str                    # the entity name
    kind: str                     # person | company | city | country
    facts: tuple[tuple[str, str], ...]  # (relation, entity name), in RELATIONS order
    text: str                     # `Title. rel: Value. rel: Value.`

    def fact(self, relation: str) -> str | None:
        for r, v in self.facts:
            if r == relation:
                return v
        return None


class SearchWorld:
    """Seeded entities, documents and a BM25 index (k1=1.2, b=0.75; the title is indexed twice)."""

    def __init__(self, seed: int = 0, n_entities: int = 300, relations: str = "full"):
        if relations not in RELATION_SETS:
            raise ConfigError(f"env.relations: unknown relations '{relations}'; valid: "
                              f"{', '.join(RELATION_SETS)}")
        self.relations = RELATION_SETS[relations]
        if n_entities < 20:
            raise ConfigError(f"env.n_entities must be at least 20, got {n_entities}")
        self.seed = seed
        self.n_entities = n_entities
        rng = random.Random(f"search-world-{seed}-{n_entities}")
        self._used_words: set[str] = set()
        names: dict[str, list[str]] = {}
        self.partner: dict[str, str] = {}          # distractor <-> base (both directions)
        for kind, share in _KIND_SHARE:
            total = max(2 if kind == "country" else 3, round(n_entities * share))
            n_base = math.ceil(total / 1.5)
            base = [self._base_name(kind, rng) for _ in range(n_base)]
            out = list(base)
            for b in rng.sample(base, total - n_base):
                d = self._distractor_name(kind, b, rng)
                out.append(d)
                self.partner[d] = b
                self.partner[b] = d
            names[kind] = out
        self.kind_of = {n: k for k, ns in names.items() for n in ns}
        facts = self._facts(names, rng)
        order = [n for k, _ in _KIND_SHARE for n in names[k]]
        rng.shuffle(order)
        self.docs: list[Doc] = []
        for i, name in enumerate(order):
            kind = self.kind_of[name]
            fs = tuple((r, facts[name][r]) for r, _ in self.relations[kind])
            text = f"{name}. " + " ".join(f"{r}: {v}." for r, v in fs)
            self.docs.append(Doc(f"d{i}", name, kind, fs, text))
        self.doc_by_id = {d.doc_id: d for d in self.docs}
        self.doc_by_title = {d.title: d for d in self.docs}
        self._build_index()

    # ---- names -------------------------------------------------------------------------------
    def _word(self, rng: random.Random, lo: int, hi: int) -> str:
        while True:
            n = rng.randint(lo, hi)
            w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n))
            w += rng.choice(_CODAS)
            w = w.capitalize()
            if 3 <= len(w) <= 9 and w.lower() not in self._used_words and w.lower() not in _RESERVED:
                self._used_words.add(w.lower())
                return w

    def _base_name(self, kind: str, rng: random.Random) -> str:
        if kind == "person":
            return f"{self._word(rng, 1, 2)} {self._word(rng, 1, 2)}"
        if kind == "company":
            return f"{self._word(rng, 2, 3)} {rng.choice(_COMPANY_SUFFIXES)}"
        return self._word(rng, 2, 3)

    def _distractor_name(self, kind: str, base: str, rng: random.Random) -> str:
        if kind == "person":
            first, last = base.split(" ")
            new = self._word(rng, 1, 2)
            return f"{first} {new}" if rng.random() < 0.5 else f"{new} {last}"
        if kind == "company":
            word, suffix = base.split(" ")
            return f"{word} {rng.choice([s for s in _COMPANY_SUFFIXES if s != suffix])}"
        pre, post = rng.choice(_CITY_AFFIXES if kind == "city" else _COUNTRY_AFFIXES)
        return f"{pre}{base}{post}"

    # ---- facts -------------------------------------------------------------------------------
    def _facts(self, names: dict[str, list[str]], rng: random.Random) -> dict[str, dict[str, str]]:
        facts: dict[str, dict[str, str]] = {n: {} for ns in names.values() for n in ns}

        def pick(name: str, rel: str, pool: list[str], exclude: set[str]) -> str:
            p = self.partner.get(name)
            if p is not None and rel in facts[p]:
                exclude = exclude | {facts[p][rel]}   # a distractor's facts differ from its base's
            cands = [x for x in pool if x not in exclude]
            return rng.choice(cands or pool)

        cities, countries = names["city"], names["country"]
        for c in cities:
            facts[c]["country"] = pick(c, "country", countries, set())
        for p in names["person"]:
            facts[p]["birthplace"] = pick(p, "birthplace", cities, set())
            facts[p]["employer"] = pick(p, "employer", names["company"], set())
        for c in names["company"]:
            facts[c]["founder"] = pick(c, "founder", names["person"], set())
            facts[c]["ceo"] = pick(c, "ceo", names["person"], {facts[c]["founder"]})
            facts[c]["hq"] = pick(c, "hq", cities, set())
        return facts

    # ---- BM25 --------------------------------------------------------------------------------
    def _build_index(self, k1: float = 1.2, b: float = 0.75) -> None:
        self._k1, self._b = k1, b
        self._postings: dict[str, list[tuple[int, int]]] = {}
        self._dl: list[int] = []
        for i, d in enumerate(self.docs):
            toks = _tokens(d.title) + _tokens(d.text)   # text starts with the title: title x2
            self._dl.append(len(toks))
            tf: dict[str, int] = {}
            for t in toks:
                tf[t] = tf.get(t, 0) + 1
            for t, c in tf.items():
                self._postings.setdefault(t, []).append((i, c))
        n = len(self.docs)
        self._avgdl = sum(self._dl) / n
        self._idf = {t: math.log(1.0 + (n - len(p) + 0.5) / (len(p) + 0.5))
                     for t, p in self._postings.items()}

    def search(self, query: str, k: int = TOP_K) -> list[Doc]:
        """The top `k` documents by BM25 (ties broken by document order); only positive scores."""
        scores: dict[int, float] = {}
        k1, b = self._k1, self._b
        for t in _tokens(query):
            idf = self._idf.get(t)
            if idf is None:
                continue
            for i, tf in self._postings[t]:
                norm = k1 * (1.0 - b + b * self._dl[i] / self._avgdl)
                scores[i] = scores.get(i, 0.0) + idf * tf * (k1 + 1.0) / (tf + norm)
        ranked = sorted(scores, key=lambda i: (-scores[i], i))
        return [self.docs[i] for i in ranked[:k] if scores[i] > 0]

    # ---- questions ---------------------------------------------------------------------------
    def chains(self, hops: int) -> list[tuple[str, tuple[str, ...]]]:
        """All (start entity, relation path) with `hops` relations whose chain visits distinct
        entities (so the answer chain is unique and never loops back)."""
        out: list[tuple[str, tuple[str, ...]]] = []

        def walk(start: str, cur: str, path: tuple[str, ...], seen: set[str]) -> None:
            if len(path) == hops:
                out.append((start, path))
                return
            for rel, _ in self.relations[self.kind_of[cur]]:
                nxt = self.doc_by_title[cur].fact(rel)
                if nxt is not None and nxt not in seen:
                    walk(start, nxt, path + (rel,), seen | {nxt})

        for d in self.docs:
            walk(d.title, d.title, (), {d.title})
        return out

    def follow(self, start: str, path: tuple[str, ...]) -> list[str]:
        chain = [start]
        for rel in path:
            nxt = self.doc_by_title[chain[-1]].fact(rel)
            if nxt is None:
                raise ValueError(f"{chain[-1]} has no {rel}")
            chain.append(nxt)
        return chain


@functools.lru_cache(maxsize=16)
def _world(seed: int, n_entities: int, relations: str = "full") -> SearchWorld:
    return SearchWorld(seed, n_entities, relations)


@functools.lru_cache(maxsize=16)
def _tasks(seed: int, n_entities: int, min_hops: int, max_hops: int,
           n_train: int, n_eval: int, relations: str = "full") -> dict[str, tuple[Task, ...]]:
    world = _world(seed, n_entities, relations)
    rng = random.Random(f"search-tasks-{seed}-{n_entities}-{min_hops}-{max_hops}")
    pools: dict[int, list[tuple[str, tuple[str, ...]]]] = {}
    for h in range(min_hops, max_hops + 1):
        pool = world.chains(h)
        rng.shuffle(pool)
        pools[h] = pool
    out: dict[str, tuple[Task, ...]] = {"lookup": _lookups(world)}
    for split, n in (("eval", n_eval), ("train", n_train)):   # pools are consumed: disjoint
        tasks = []
        for i in range(n):
            live = [h for h in pools if pools[h]]
            if not live:
                raise ValueError(
                    f"search world (seed={seed}, n_entities={n_entities}) has too few "
                    f"{min_hops}..{max_hops}-hop questions for {n_train} train + {n_eval} eval")
            h = rng.choice(live)
            start, path = pools[h].pop()
            tasks.append(_question(world, f"search-{split}-{i:05d}", start, path))
        out[split] = tuple(tasks)
    return out


def _question(world: SearchWorld, task_id: str, start: str, path: tuple[str, ...]) -> Task:
    """The task asking for the end of `start`'s chain along the relations `path`."""
    chain = world.follow(start, path)
    meta = {
        "hops": len(path),
        "start": start,
        "relations": list(path),
        "chain": chain,
        "doc_ids": [world.doc_by_title[e].doc_id for e in chain],
    }
    return Task(task_id=task_id, prompt="Question: " + " > ".join((start, *path)),
                answer=chain[-1], meta=meta)


def _lookups(world: SearchWorld) -> tuple[Task, ...]:
    """One-hop questions, one per (entity, relation) of the world ("lookup" split): the
    knowledge-base reading the tiny model's warm-up imitates next to the training questions,
    so that a held-out question is a new *composition* of hops the base has seen done."""
    pairs = [(d.title, rel) for d in world.docs for rel, _ in d.facts]
    return tuple(_question(world, f"search-lookup-{i:05d}", start, (rel,))
                 for i, (start, rel) in enumerate(pairs))


class SearchEnv(CallEnv):
    """One episode at a time over a shared `SearchWorld`: `search`, `open` and `answer` in
    `parse_action`'s syntax (see `CallEnv` for the bookkeeping)."""

    system_prompt = SYSTEM_PROMPT
    tools = ("search", "open", "answer")
    malformed = MALFORMED

    def __init__(self, world: SearchWorld, max_turns: int = 12, call_cost: float = 0.0):
        self.world = world
        super().__init__(max_turns, call_cost)

    def _parse(self, action: str) -> tuple[str, str] | None:
        return parse_action(action)

    def _tool(self, tool: str, arg: str) -> tuple[str, bool]:
        if tool == "search":
            if not _tokens(arg):
                return "error: empty query", True
            hits = self.world.search(arg)
            if not hits:
                return "no results", False
            return "\n".join(f"{d.doc_id} {d.title}" for d in hits), False
        doc = self.world.doc_by_id.get(arg)  # open
        return (f"error: no document {arg}", True) if doc is None else (doc.text, False)

    def _check(self, arg: str) -> bool:
        return normalize_answer(arg) == normalize_answer(self.task.answer)


def _expert_action(env: SearchEnv, rng: random.Random, error_rate: float) -> str:
    """Replay the history to find where the expert is on the chain, then act (see SearchSpec)."""
    task = env.task
    if task is None:
        return "search(start)"
    world = env.world
    path: list[str] = task.meta["relations"]
    cur: str = task.meta["chain"][0]
    hop = 0
    stuck: Doc | None = None          # opened a doc lacking the hop's relation
    pending: list[tuple[str, str]] | None = None  # results of the last search, if it was for `cur`
    for h in env.history:
        if hop >= len(path) or stuck is not None:
            break
        if h["tool"] == "search" and not h["error"] and h["observation"] != "no results":
            if normalize_answer(h["arg"]) == normalize_answer(cur):
                pending = [tuple(line.split(" ", 1)) for line in h["observation"].split("\n")]
            else:
                pending = None
            continue
        if h["tool"] == "open" and not h["error"]:
            doc = world.doc_by_id[h["arg"]]
            if doc.title == cur or (pending is not None and any(i == doc.doc_id for i, _ in pending)):
                value = doc.fact(path[hop])
                if value is None:
                    stuck = doc
                else:
                    cur, hop = value, hop + 1
        pending = None
    if hop >= len(path):
        return f"answer({cur})"
    if stuck is not None:
        seen = sorted({stuck.title, *(v for _, v in stuck.facts)})
        return f"answer({rng.choice(seen)})"
    if pending is not None:
        right = world.doc_by_title[cur].doc_id
        wrong = [i for i, _ in pending if i != right]
        if error_rate > 0 and wrong and rng.random() < error_rate:
            words = set(_tokens(cur))
            similar = [i for i, t in pending if i != right and words & set(_tokens(t))]
            return f"open({rng.choice(similar or wrong)})"
        return f"open({right})"
    return f"search({cur})"


class SearchSpec:
    """The "search" env spec: a cached world, deterministic train/eval tasks and the expert."""

    name = "search"
    tool_schemas = TOOL_SCHEMAS
    tools_system_prompt = TOOLS_SYSTEM_PROMPT
    # "lookup": one-hop questions about every entity (for warm-up demonstrations, not RL)
    splits = ("train", "eval", "lookup")

    def __init__(self, seed: int = 0, n_entities: int = 300, min_hops: int = 2,
                 max_hops: int = 3, n_train: int = 600, n_eval: int = 200, max_turns: int = 12,
                 relations: str = "full", call_cost: float = 0.0):
        if not 1 <= min_hops <= max_hops:
            raise ConfigError(f"the search env needs 1 <= env.min_hops <= env.max_hops, got "
                              f"{min_hops}..{max_hops}")
        if max_hops > 5:
            raise ConfigError(f"env.max_hops must be at most 5 for the search env (its longest "
                              f"relation chain), got {max_hops}")
        if n_train < 0 or n_eval < 0:
            raise ConfigError("env.n_train and env.n_eval must be non-negative")
        self.seed, self.n_entities = int(seed), int(n_entities)
        self.min_hops, self.max_hops = int(min_hops), int(max_hops)
        self.n_train, self.n_eval, self.max_turns = int(n_train), int(n_eval), int(max_turns)
        self.relations = relations
        self.call_cost = check_call_cost(call_cost)
        self.world = _world(self.seed, self.n_entities, relations)

    def make(self) -> SearchEnv:
        return SearchEnv(self.world, self.max_turns, self.call_cost)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in self.splits:
            raise ConfigError(f"unknown split '{split}'; valid: {', '.join(self.splits)}")
        all_tasks = _tasks(self.seed, self.n_entities, self.min_hops, self.max_hops,
                           self.n_train, self.n_eval, self.relations)[split]
        return list(all_tasks if n is None else all_tasks[:n])

    def expert(self, env: SearchEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """Per hop: `search(<entity>)`, `open(<its doc id>)`, read the hop's relation; finally
        `answer(<entity>)`. With `error_rate` e, each open picks a wrong search result (a
        similar-named one when there is one) with probability e and the expert then follows
        what that document says (answering with an entity it saw if the relation is missing)."""
        return _expert_action(env, rng, error_rate)


@env_factory("search", ("n_entities", "min_hops", "max_hops", "n_train", "n_eval", "max_turns",
                         "relations", "call_cost"))
def make_search_spec(seed: int = 0, **options: Any) -> SearchSpec:
    """Registry factory. Options: n_entities, min_hops, max_hops, n_train, n_eval, max_turns,
    relations ("full" | "single"), call_cost (`CallEnv`: a correct answer's reward less this
    per message before it)."""
    return SearchSpec(seed, **options)


ENVS.register("search", make_search_spec)
