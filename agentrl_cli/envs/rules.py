"""The built-in "rules" env: rule application in the spirit of DeonticBench, in miniature.

Every task has its own seeded airline rulebook (nine short rules: checked bag fee, gold member
bags, overweight bags, change fee, lounge access, upgrades, refunds, plus two that no question
needs) with its own amounts, thresholds and rule ids, a passenger's case facts and one question
with a yes/no or a whole-dollar answer, e.g.
`Case: Ann, gold member, economy, basic fare, 18000 miles, booked 30 h ago, bags: 24, 18 kg.
Question: What is Ann's checked bag fee in $?` The rules must be looked up: ids and numbers
differ from task to task. `hops` is the number of rules the question needs (1-4).

Tools (the whole assistant message is exactly one call, see `calls.py`):
  search(QUERY)      -> up to 3 rules, one line each: `R4 overweight bags`
  rule(ID)           -> the rule: `R4 overweight bags: each bag over 23 kg costs $100 (heavy) extra.`
  calc(EXPRESSION)   -> exact arithmetic (the `math` env's safe calculator) over numbers and the
                        named amounts of the rules read so far: a rule names each dollar
                        amount it sets (`$30 (bag1)`) and `calc(bag1+heavy*2)` uses them, so
                        the agent refers to an amount instead of copying it. A name whose rule
                        was not read in the episode is an error.
  answer(TEXT)       -> ends the episode; reward 1.0 if right, else 0.0: `yes`/`no`
                        (case and punctuation ignored), or a number checked by math-verify
                        (`220`, `$220` and `220.0` all match).

Everything is deterministic from the seed (`random.Random`, never the global RNG).
"""
from __future__ import annotations

import functools
import random
import re
import string
from dataclasses import dataclass
from typing import Any

from .base import ENVS, Task, env_factory
from .calls import CallEnv, CallSpec
from .tool_calls import function_tool
from .mathword import CalcError, calculate, check_answer, format_number

__all__ = [
    "Rule",
    "RulesEnv",
    "RulesSpec",
    "MALFORMED",
    "SYSTEM_PROMPT",
    "make_rules_spec",
    "make_case",
    "search_rules",
]

SYSTEM_PROMPT = ("Answer the case question using tools, one call per message: search(query), "
                 "rule(id), calc(expression), answer(text).")
MALFORMED = "error: use search(query), rule(id), calc(expression) or answer(text)"
TOOLS = ("search", "rule", "calc", "answer")
# the tools as JSON schemas, for models that call tools in their own format (model.tool_format)
TOOL_SCHEMAS = (
    function_tool("search", "Search the rulebook; returns up to 3 rules, one `id title` per line.",
                  query=("string", "words to search for, e.g. bag fee")),
    function_tool("rule", "Read a rule.", id=("string", "a rule id from a search result, e.g. R4")),
    function_tool("calc", "Exact arithmetic over + - * / ** and parentheses, with the named "
                          "amounts of the rules read, e.g. bag1 for `$30 (bag1)`.",
                  expression=("string", "e.g. bag1+heavy*2+100")),
    function_tool("answer", "Give the final answer; ends the episode.",
                  text=("string", "yes, no or a whole-dollar amount")),
)
TOOLS_SYSTEM_PROMPT = "Answer the case question using the tools, one call per message; end with answer."
TOP_K = 3
MAX_HOPS = 4

_NAMES = ("Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jill", "Kai",
          "Lena", "Milo", "Nia", "Omar", "Pia", "Rex", "Sara", "Tom", "Uma")
# topic -> the expert's search query for it
_QUERY = {"bag": "bag fee", "gold": "gold", "weight": "overweight", "change": "change fee",
          "lounge": "lounge", "upgrade": "upgrade", "refund": "refund"}
# hops -> question kinds (a kind's rules depend on the case: gold members need the gold rule)
_KINDS = {1: ("change", "lounge", "upgrade", "refund"), 2: ("bags", "lounge_upgrade"),
          3: ("bags", "bags_change"), 4: ("bags_change",)}


@dataclass(frozen=True)
class Rule:
    rule_id: str
    topic: str
    title: str
    text: str

    def render(self) -> str:
        return f"{self.rule_id} {self.title}: {self.text}"


def _rulebook(rng: random.Random) -> tuple[dict[str, Rule], dict[str, int]]:
    p = {"A": rng.randrange(20, 45, 5), "B": rng.randrange(30, 65, 5), "N": rng.randint(1, 2),
         "W": rng.choice((20, 23, 25)), "C": rng.randrange(50, 160, 10),
         "D": rng.randrange(50, 175, 25), "L": rng.randrange(20000, 70000, 10000),
         "M": rng.randrange(10000, 50000, 5000), "H": rng.choice((12, 24, 48)),
         "P": rng.randrange(40, 130, 10), "S": rng.randrange(10, 40, 5)}
    items = [
        ("bag", "checked bag fee",
         f"the first checked bag costs ${p['A']} (bag1), each further bag ${p['B']} "
         "(bag2)."),
        ("gold", "gold member bags",
         f"gold members check their first {p['N']} bag{'s' if p['N'] > 1 else ''} free."),
        ("weight", "overweight bags",
         f"each bag over {p['W']} kg costs ${p['C']} (heavy) extra."),
        ("change", "change fee", f"a flight change costs ${p['D']} (change), free on flex fares."),
        ("lounge", "lounge access", f"business class, or at least {p['L']} miles."),
        ("upgrade", "upgrades", f"need at least {p['M']} miles and a fare that is not basic."),
        ("refund", "refunds", f"within {p['H']} hours of booking, or any time on flex fares."),
        ("pet", "pets in cabin", f"${p['P']} (pet) per pet, not on basic fares."),
        ("seat", "seat choice", f"${p['S']} (seat) per seat, free in business class."),
    ]
    ids = [f"R{i}" for i in range(1, len(items) + 1)]
    rng.shuffle(ids)
    book = {}
    for (topic, title, text), rid in sorted(zip(items, ids), key=lambda x: int(x[1][1:])):
        book[rid] = Rule(rid, topic, title, text)
    return book, p


def _stem(tok: str) -> str:
    return tok[:-1] if len(tok) > 3 and tok.endswith("s") else tok


def _toks(text: str) -> set[str]:
    return {_stem(t) for t in re.findall(r"[a-z0-9]+", text.lower())}


def search_rules(book: dict[str, Rule], query: str, k: int = TOP_K) -> list[Rule]:
    """Rules ranked by query words in the title (weight 2) and the text (weight 1); a plural
    `s` is ignored; ties go to the lower id; only positive scores."""
    q = _toks(query)
    scored = [(2 * len(q & _toks(r.title)) + len(q & _toks(r.text)), int(r.rule_id[1:]), r)
              for r in book.values()]
    scored = [s for s in scored if s[0] > 0]
    scored.sort(key=lambda s: (-s[0], s[1]))
    return [r for _, _, r in scored[:k]]


def _bag_terms(p: dict[str, int], gold: bool, bags: list[int]) -> list[tuple[str, str, int]]:
    """(topic, expression, value) of each fee term of the checked bags, counted: the same
    amount once with its multiplier (`bag2*2`)."""
    free = p["N"] if gold else 0
    paid = [i for i in range(len(bags)) if i >= free]
    terms = []
    if 0 in paid:
        terms.append(("bag", "bag1", p["A"]))
    further = len([i for i in paid if i > 0])
    if further:
        terms.append(("bag", f"bag2*{further}" if further > 1 else "bag2",
                      p["B"] * further))
    heavy = sum(w > p["W"] for w in bags)
    if heavy:
        terms.append(("weight", f"heavy*{heavy}" if heavy > 1 else "heavy",
                      p["C"] * heavy))
    return terms


def bag_items(p: dict[str, int], gold: bool, bags: list[int]) -> list[str]:
    """The checked bags' fee itemised bag by bag, in the case's order: each bag's base amount
    (`0` for a gold member's free bag, `bag1` for the first bag, `bag2` after it), then
    `heavy` when it is over the weight limit. The sum equals `_bag_terms`'s; the expert writes
    it this way so each rule's application is one decision about one bag."""
    free = p["N"] if gold else 0
    items = []
    for i, w in enumerate(bags):
        items.append("0" if i < free else "bag1" if i == 0 else "bag2")
        if w > p["W"]:
            items.append("heavy")
    return items


FEE_NAMES = ("bag1", "bag2", "heavy", "change")


def fee_counts(expr: str) -> dict[str, int]:
    """How often each named amount enters a `+`-sum of names, `name*k` and numbers:
    `bag1+heavy+bag2*2` -> {"bag1": 1, "heavy": 1, "bag2": 2}; numbers are ignored."""
    counts: dict[str, int] = {}
    for term in expr.replace(" ", "").split("+"):
        name, _, k = term.partition("*")
        if NAME.fullmatch(name):
            counts[name] = counts.get(name, 0) + (int(k) if k.isdigit() else 1)
    return counts


def make_case(rng: random.Random, hops: int) -> tuple[str, str, dict]:
    """(prompt, gold answer, meta) of one case with a question needing `hops` rules. Yes/no
    questions are answered yes half of the time (the facts are redrawn until they agree)."""
    book, p = _rulebook(rng)
    kind = rng.choice(_KINDS[hops])
    want = rng.choice(("yes", "no"))
    for _ in range(100):
        prompt, answer, meta = _case(rng, hops, kind, book, p)
        if meta["numeric"] or answer == want:
            break
    return prompt, answer, meta


def _case(rng: random.Random, hops: int, kind: str, book: dict[str, Rule],
          p: dict[str, int]) -> tuple[str, str, dict]:
    name = rng.choice(_NAMES)
    gold_member = {"bags": hops == 3, "bags_change": hops == 4}.get(kind, rng.random() < 0.3)
    tier = "gold member" if gold_member else rng.choice(("silver member", "no status"))
    cabin = rng.choice(("economy", "economy", "business"))
    fare = rng.choice(("basic", "standard", "flex"))
    miles = rng.randrange(5000, 80000, 1000)
    booked = rng.choice((2, 6, 10, 20, 30, 40, 60, 90))
    bags = [rng.randint(12, 30) for _ in range(rng.randint(1, 3))]
    facts = (f"Case: {name}, {tier}, {cabin}, {fare} fare, {miles} miles, booked {booked} h ago, "
             f"bags: {', '.join(map(str, bags))} kg.")
    lounge = cabin == "business" or miles >= p["L"]
    upgrade = miles >= p["M"] and fare != "basic"
    change = 0 if fare == "flex" else p["D"]
    terms: list[tuple[str, str, int]] = []
    items: list[str] = []                     # the fee bag by bag (`bag_items`), then change
    if kind == "change":
        q = f"What does {name} pay to change the flight, in $?"
        topics, answer = ["change"], str(change)
        terms = [("change", "change", change)]
        items = ["change"] if change else []
    elif kind == "lounge":
        q, topics, answer = f"Does {name} get lounge access?", ["lounge"], "yes" if lounge else "no"
    elif kind == "upgrade":
        q, topics, answer = f"Can {name} get an upgrade?", ["upgrade"], "yes" if upgrade else "no"
    elif kind == "refund":
        ok = fare == "flex" or booked <= p["H"]
        q, topics, answer = f"Can {name} get a refund?", ["refund"], "yes" if ok else "no"
    elif kind == "lounge_upgrade":
        q = f"Does {name} get both lounge access and an upgrade?"
        topics, answer = ["lounge", "upgrade"], "yes" if lounge and upgrade else "no"
    else:
        topics = ["bag", "weight"] + (["gold"] if gold_member else [])
        terms = _bag_terms(p, gold_member, bags)
        items = bag_items(p, gold_member, bags)
        if kind == "bags_change":
            topics.append("change")
            terms.append(("change", "change", change))
            items += ["change"] if change else []
            q = f"{name} changes the flight. What are the bag and change fees in total, in $?"
        else:
            q = f"What is {name}'s checked bag fee in $?"
        answer = str(sum(v for _, _, v in terms))
    by_topic = {r.topic: r.rule_id for r in book.values()}
    meta = {"hops": hops, "kind": kind, "rules": [r.render() for r in book.values()],
            "needed": [by_topic[t] for t in topics], "queries": [_QUERY[t] for t in topics],
            "terms": [[t, e, v] for t, e, v in terms if v != 0], "items": items,
            "numeric": answer not in ("yes", "no")}
    return f"{facts} Question: {q}", answer, meta


@functools.lru_cache(maxsize=16)
def _tasks(seed: int, min_hops: int, max_hops: int, n_train: int,
           n_eval: int) -> dict[str, tuple[Task, ...]]:
    rng = random.Random(f"rules-tasks-{seed}-{min_hops}-{max_hops}")
    seen: set[str] = set()
    out: dict[str, tuple[Task, ...]] = {}
    for split, n in (("eval", n_eval), ("train", n_train)):   # disjoint by prompt and rulebook
        tasks: list[Task] = []
        while len(tasks) < n:
            prompt, answer, meta = make_case(rng, rng.randint(min_hops, max_hops))
            key = prompt + "\n" + "\n".join(meta["rules"])
            if key in seen:
                continue
            seen.add(key)
            tasks.append(Task(task_id=f"rules-{split}-{len(tasks):05d}", prompt=prompt,
                              answer=answer, meta=meta))
        out[split] = tuple(tasks)
    return out


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).strip(string.punctuation + string.whitespace)


def check_rules_answer(pred: str, gold: str) -> bool:
    """yes/no by normalised equality; numbers by math-verify."""
    if gold in ("yes", "no"):
        return _norm(pred) == gold
    return check_answer(pred, gold)


# ------------------------------------------------------------------------------ env
AMOUNT = re.compile(r"\$(\d+) \(([a-z_][a-z_0-9]*)\)")      # a named amount in a rule's text
NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def rule_amounts(text: str) -> dict[str, int]:
    """The named amounts a rule's text sets: `$30 (bag1)` -> {"bag1": 30}."""
    return {name: int(value) for value, name in AMOUNT.findall(text)}


class RulesEnv(CallEnv):
    """One episode at a time: `search`, `rule`, `calc` and `answer` over the task's rulebook
    (see `CallEnv` for the bookkeeping). `calc` knows the named amounts of the rules the
    episode has read (from its history, so a restored state knows its own)."""

    system_prompt = SYSTEM_PROMPT
    tools = TOOLS
    malformed = MALFORMED

    def _load(self) -> None:
        self.book: dict[str, Rule] = {}
        if self.task is not None:
            for line in self.task.meta["rules"]:
                head, text = line.split(": ", 1)
                rid, title = head.split(" ", 1)
                self.book[rid] = Rule(rid, "", title, text)

    def _tool(self, tool: str, arg: str) -> tuple[str, bool]:
        if tool == "search":
            if not _toks(arg):
                return "error: empty query", True
            hits = search_rules(self.book, arg)
            return ("\n".join(f"{r.rule_id} {r.title}" for r in hits) if hits else "no results"), False
        if tool == "rule":
            r = self.book.get(arg.upper())
            return (r.render(), False) if r is not None else (f"error: no rule {arg}", True)
        known: dict[str, int] = {}
        for h in self.history:
            if h["tool"] == "rule" and not h["error"]:
                known.update(rule_amounts(h["observation"]))
        unknown = [n for n in NAME.findall(arg) if n not in known]
        if unknown:
            return f"error: unknown amount {unknown[0]} (read the rule that names it)", True
        try:  # calc
            return format_number(calculate(NAME.sub(lambda m: str(known[m.group(0)]), arg))), False
        except CalcError as e:
            return f"error: {e}", True

    def _check(self, arg: str) -> bool:
        return check_rules_answer(arg, self.task.answer)


def _wrong(rng: random.Random, meta: dict, answer: str) -> tuple[str | None, str]:
    """A plausible mistake, misapplying one rule: (a calc expression to run first, or None,
    and else the answer)."""
    if answer in ("yes", "no"):
        return None, "no" if answer == "yes" else "yes"
    items = meta["items"]
    paid = [i for i, e in enumerate(items) if e != "0"]
    if len(paid) >= 2:                        # one fee item forgotten
        drop = rng.choice(paid)
        return "+".join(e for i, e in enumerate(items) if i != drop), ""
    value = int(answer)
    return None, str(value + (25 if value < 25 else rng.choice((-25, 25, 50))))


def _expert_action(env: RulesEnv, rng: random.Random, error_rate: float) -> str:
    """Replay the history (rules read, ids seen in search results, the last calc), then act."""
    task = env.task
    if task is None:
        return "search(rules)"
    meta = task.meta
    seen_ids: set[str] = set()
    read: set[str] = set()
    for h in env.history:
        if h["error"]:
            continue
        if h["tool"] == "search":
            seen_ids |= {line.split(" ", 1)[0] for line in h["observation"].split("\n")}
        elif h["tool"] == "rule":
            read.add(h["arg"].upper())
    for rid, query in zip(meta["needed"], meta["queries"]):
        if rid not in read:
            return f"rule({rid})" if rid in seen_ids else f"search({query})"
    right = "+".join(meta["items"]) or None      # named amounts bag by bag, None for $0
    last = env.history[-1] if env.history else None
    if last is not None and last["tool"] == "calc" and not last["error"]:
        if last["arg"] == right or error_rate > 0:
            return f"answer({last['observation']})"
    if error_rate > 0 and rng.random() < 1.0 - (1.0 - error_rate) ** meta["hops"]:
        expr, wrong = _wrong(rng, meta, task.answer)
        return f"calc({expr})" if expr is not None else f"answer({wrong})"
    return f"calc({right})" if right is not None else f"answer({task.answer})"


class RulesSpec(CallSpec):
    """The "rules" env spec: deterministic train/eval cases and the scripted expert
    (options and tasks: see `CallSpec`)."""

    name = "rules"
    tool_schemas = TOOL_SCHEMAS
    tools_system_prompt = TOOLS_SYSTEM_PROMPT
    env_class = RulesEnv
    hops_limit = MAX_HOPS
    build = staticmethod(_tasks)

    def expert(self, env: RulesEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """For each rule the question needs: `search(<topic>)` unless its id was already in a
        search result, then `rule(<id>)`; then, for a fee, `calc(<its amounts by name, bag by
        bag>)` (`calc(bag1+heavy+bag2+change)` for two bags, the first over the limit;
        `bag_items`; none for a fee of $0); then `answer(...)`. With `error_rate` e, the
        expert misapplies one rule with probability 1 - (1 - e)^hops (drops one fee item, or
        flips yes/no) and answers accordingly."""
        return _expert_action(env, rng, error_rate)


@env_factory("rules", ("min_hops", "max_hops", "n_train", "n_eval", "max_turns", "call_cost"))
def make_rules_spec(seed: int = 0, **options: Any) -> RulesSpec:
    """Registry factory. Options: min_hops, max_hops (rules a question needs, 1-4), n_train,
    n_eval, max_turns, call_cost (`CallEnv`)."""
    return RulesSpec(seed, **options)


ENVS.register("rules", make_rules_spec)
