"""Measured results from records: `docs/records/*.json` hold one measured set of runs each (its
commands, build, date, env, budget, steps and the per-seed values of each metric the pages
quote); this module derives the numbers the pages print (means, paired differences over seeds
± their standard error, the verdict words) and writes them between generated-section markers
in `docs/results.md`, `docs/results-runs.md` (the full tables behind the verdicts) and
`README.md`. It reads JSON only.

    python -m agentrl_cli.reporting.records          # rewrite the generated sections
    python -m agentrl_cli.reporting.records --check  # exit 1, one line per problem

The check (`problems`) finds: a record that is not JSON, not of a record's shape, holds NaN or
an infinite number, or whose per-seed values do not give its summary; a page that is missing,
empty, or truncated (its last line is not `PAGE_END`); a section without its begin or end
marker, one that names no record, a record shown on neither results page; a generated
section that disagrees with the records; and a number quoted in prose (`QUOTES`) that is not
the record's, or a quote no longer found. Each is one line; rewriting fixes only the numbers.

A record's metrics:
- `per_seed`: {metric: [one value per seed, in the order of `seeds`]}; success values are
  fractions (`base`, `final`, `mean_of_checks`), `final_minus_base` is in points.
- `given`: {metric: [mean, spread]}: a summary as the table that measured it printed (mean ±
  std over seeds; for `vs_ref` and `last_vs_ref`, the paired difference ± its standard error,
  in points). A record transcribed from a page where only the summary survived carries only
  `given`; where both exist, `given` (computed from unrounded values) is printed, and
  `check_record` holds the per-seed values to it within rounding.

A record of `"kind": "departures"` holds no runs: its `rows` name, per recipe, a departure
from the paper, the recipe's and the paper's values of the keys concerned and the measured
evidence; the results page's "Recipe departures" table is made from it.

The standard (docs/results.md, "How to read this page"): a method is ahead of its reference
only when their paired difference of the mean of checks exceeds its standard error, behind
when below minus it, else level; a run off the matched budget by more than `BUDGET_SLACK` gets
no verdict.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from .record_quotes import compare, rewrite, short

BUDGET_SLACK = 0.05          # a run's tokens per step may differ from the budget by 5%
TOLERANCE = {"base": 0.0015, "final": 0.0015, "mean_of_checks": 0.0015, "tokens_per_step": 1.5,
             "final_minus_base": 0.15, "vs_ref": 0.15, "last_vs_ref": 0.15, "wall_s": 1.0}
SPREAD_TOLERANCE = {"mean_of_checks": 0.0015, "final_minus_base": 0.2, "vs_ref": 0.2,
                    "last_vs_ref": 0.2, "tokens_per_step": 1.5}
COLUMNS = {"seeds": "seeds", "base": "base", "final": "last check",
           "mean_of_checks": "mean of checks", "final_minus_base": "last - base (points)",
           "vs_ref": "vs {ref} (points, paired)", "verdict": "verdict",
           "last_vs_ref": "last check vs {ref} (points, paired)",
           "tokens_per_step": "gen. tokens / step", "wall_s": "wall s / run",
           "pass_at_k": "pass@{k} at the end", "tasks_per_step": "tasks / step",
           "mixed_outcome_share": "mixed-outcome groups"}
# what a step learnt from (`agentrl diagnose table --record` stores them per seed): shown as
# columns of every record whose arms carry them, after the record's own columns
LEARNT_FROM = ("tasks_per_step", "mixed_outcome_share")
BEGIN = "<!-- from docs/records: {key} -->"     # python -m agentrl_cli.reporting.records
END = "<!-- end: {key} -->"
SECTION = re.compile(r"<!-- from docs/records: (\S+) -->")


class RecordError(ValueError):
    """A record or page the check cannot take: its message is one line naming the file."""


def _no_constant(name: str):
    raise RecordError(f"{name} is not a measured value")


def _finite(text: str) -> float:
    x = float(text)
    if x != x or x in (float("inf"), float("-inf")):
        raise RecordError(f"{text} is not a finite number")
    return x


def read_record(path: Path) -> dict:
    """One record file, checked: JSON (no NaN or infinite numbers) of a record's shape whose
    per-seed values give its summaries (`check_record`); else one-line RecordError."""
    name = f"docs/records/{path.name}"
    try:
        rec = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant,
                         parse_float=_finite)
    except RecordError as e:
        raise RecordError(f"{name}: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{name}: cannot be read ({type(e).__name__})") from None
    except json.JSONDecodeError as e:
        raise RecordError(f"{name}: not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    problems = check_record(rec)
    if problems:
        raise RecordError(f"{name}: " + "; ".join(problems))
    return rec


def load_records(folder: Path) -> dict[str, dict]:
    """Every record under `folder`, by file stem; a record that fails `read_record` raises
    its one-line RecordError (a ValueError)."""
    return {path.stem: read_record(path) for path in sorted(Path(folder).glob("*.json"))}


# ---- derived numbers -------------------------------------------------------------------

def _scale(metric: str) -> float:
    return 100.0 if metric in ("vs_ref", "last_vs_ref") else 1.0


def _arm(rec: dict, name: str) -> dict:
    arm = next((a for a in rec["arms"] if a["name"] == name), None)
    if arm is None:
        raise KeyError(f"arm {name} of record {rec.get('title', '?')}")
    return arm


def paired_difference(mine: dict, theirs: dict) -> tuple[float, float, int] | None:
    """The page's comparison: (mean, standard error, seeds) of `mine[seed] - theirs[seed]`
    over the seeds both have (two or more), else None. `agentrl diagnose table` uses it
    on run folders, `paired` on records."""
    d = [mine[s] - theirs[s] for s in mine if s in theirs]
    if len(d) < 2:
        return None
    return statistics.mean(d), statistics.stdev(d) / len(d) ** 0.5, len(d)


def verdict_word(mean: float, se: float) -> str:
    """The page's standard: ahead only when the paired difference exceeds its standard error,
    behind when it is below minus it, else level."""
    return "ahead" if mean > se else "behind" if mean < -se else "level"


def paired(rec: dict, arm: dict, key: str) -> tuple[float, float] | None:
    """(mean, standard error) in points of the arm's per-seed `key` minus its reference's on
    the seeds both share (two or more), else None."""
    ref_name = arm.get("reference")
    if ref_name is None:
        return None
    ref = _arm(rec, ref_name)
    mine = {s: 100 * v for s, v in zip(arm["seeds"], arm.get("per_seed", {}).get(key, []))}
    theirs = {s: 100 * v for s, v in zip(ref["seeds"], ref.get("per_seed", {}).get(key, []))}
    diff = paired_difference(mine, theirs)
    return None if diff is None else diff[:2]


def computed(rec: dict, arm: dict, metric: str) -> tuple[float, float | None] | None:
    """A metric's summary from the arm's per-seed values: (mean, std over seeds) or, for the
    paired columns, (mean, standard error); None when the values are not there."""
    per = arm.get("per_seed", {})
    if metric in ("vs_ref", "last_vs_ref"):
        return paired(rec, arm, "mean_of_checks" if metric == "vs_ref" else "final")
    if metric == "final_minus_base" and metric not in per and "final" in per and "base" in per:
        xs = [100 * (f - b) for f, b in zip(per["final"], per["base"])]
    else:
        xs = per.get(metric)
    if not xs:
        return None
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else None)


def summary(rec: dict, arm: dict, metric: str) -> tuple[float, float | None] | None:
    """What the pages print for a metric: the summary the measuring table gave, else the one
    computed from the per-seed values."""
    given = arm.get("given", {}).get(metric)
    return tuple(given) if given is not None else computed(rec, arm, metric)


def off_budget(rec: dict, arm: dict) -> float | None:
    """The arm's tokens per step over the record's budget, minus 1, when beyond the slack."""
    tokens = summary(rec, arm, "tokens_per_step")
    if not rec.get("budget") or tokens is None:
        return None
    off = tokens[0] / rec["budget"] - 1
    return off if abs(off) > BUDGET_SLACK else None


def verdict(rec: dict, arm: dict) -> str:
    """ahead / behind / level against the arm's reference on the paired mean of checks; "off
    the budget" when its tokens per step are not the matched budget's; "–" without a pair."""
    off = off_budget(rec, arm)
    if off is not None:
        return f"off the budget ({100 * off:+.0f}% tokens)"
    diff = summary(rec, arm, "vs_ref")
    if diff is None or arm.get("reference") is None:
        return "–"
    return verdict_word(*diff)


def wall_ratio(rec: dict, arm: str, ref: str) -> float:
    """Total wall seconds of an arm's runs over its reference's (the same seeds)."""
    return sum(_arm(rec, arm)["per_seed"]["wall_s"]) / sum(_arm(rec, ref)["per_seed"]["wall_s"])


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _arm_shape(i: int, arm) -> list[str]:
    """What keeps an arm from being read: its fields' types."""
    if not isinstance(arm, dict):
        return [f"arm {i} is not an object"]
    where = f"arm {arm.get('name', i)}"
    out = [f"{where}: no {k}" for k in ("name", "label", "seeds") if not isinstance(arm.get(k), (str if k != "seeds" else list))]
    if isinstance(arm.get("seeds"), list) and not all(isinstance(s, int) and not isinstance(s, bool) for s in arm["seeds"]):
        out.append(f"{where}: seeds are not integers")
    for field, n in (("per_seed", None), ("given", 2), ("exploration", 2)):
        values = arm.get(field, {})
        if not isinstance(values, dict):
            out.append(f"{where}: {field} is not an object")
            continue
        for metric, xs in values.items():
            ok = isinstance(xs, list) and all(_is_num(x) or (n and j == 1 and x is None) for j, x in enumerate(xs))
            if not ok or (n is not None and len(xs) != n):
                out.append(f"{where}: {field}.{metric} is not a list of "
                           + ("numbers" if n is None else "[mean, spread]"))
    return out


def record_shape(rec) -> list[str]:
    """What keeps a record from being read at all: not an object, no arms, fields of the
    wrong type (the renderer reads these)."""
    if not isinstance(rec, dict):
        return ["not a JSON object"]
    if not isinstance(rec.get("arms"), list) or not rec["arms"]:
        return ["no arms"]
    out = [f"{k} is not a {t.__name__}" for k, t in (("commands", list), ("steps", int))
           if k in rec and not isinstance(rec[k], t)]
    if "budget" in rec and rec["budget"] is not None and not _is_num(rec["budget"]):
        out.append("budget is not a number")
    return out + [p for i, arm in enumerate(rec["arms"]) for p in _arm_shape(i, arm)]


def check_record(rec: dict) -> list[str]:
    """What is wrong with a record: its shape (`record_shape`), missing fields, per-seed lists
    of the wrong length, a reference that is not an arm, per-seed values that do not give the
    summary beside them. A departures record (no arms) has its own check."""
    if isinstance(rec, dict) and rec.get("kind") == "departures":
        return _check_departures(rec)
    shape = record_shape(rec)
    if shape:
        return shape
    need = ("title", "date", "build", "env", "steps", "commands", "source", "arms")
    problems = [f"no {k}" for k in need if k not in rec]
    names = {a.get("name") for a in rec.get("arms", [])}
    for arm in rec.get("arms", []):
        if arm.get("reference") not in (None, *names):
            problems.append(f"{arm.get('name')}: reference {arm['reference']} is not an arm")
            continue
        for metric, xs in arm.get("per_seed", {}).items():
            if len(xs) != len(arm["seeds"]):
                problems.append(f"{arm['name']}: {len(xs)} values of {metric} for "
                                f"{len(arm['seeds'])} seeds")
        if not any(p.startswith(arm.get("name", "")) for p in problems):
            problems += _agreement(rec, arm)
    return problems


DEPARTURE_FIELDS = ("recipe", "departure", "recipe_values", "paper_values", "evidence")


def _check_departures(rec: dict) -> list[str]:
    """What is wrong with a record of recipe departures: missing fields, a row without its
    recipe's and its paper's values of the same keys."""
    problems = [f"no {k}" for k in ("title", "source", "rows") if k not in rec]
    for i, row in enumerate(rec.get("rows", [])):
        missing = [f"row {i}: no {k}" for k in DEPARTURE_FIELDS if k not in row]
        if not missing and set(row["recipe_values"]) != set(row["paper_values"]):
            missing.append(f"row {i}: recipe_values and paper_values name different keys")
        problems += missing
    return problems


def _agreement(rec: dict, arm: dict) -> list[str]:
    out = []
    for metric, given in arm.get("given", {}).items():
        got = computed(rec, arm, metric) if metric in TOLERANCE else None
        if got is None:
            continue
        if abs(got[0] - given[0]) > TOLERANCE[metric]:
            out.append(f"{arm['name']}: per-seed {metric} give {got[0]:.4g}, the record says {given[0]}")
        elif (got[1] is not None and metric in SPREAD_TOLERANCE
              and abs(got[1] - given[1]) > SPREAD_TOLERANCE[metric]):
            out.append(f"{arm['name']}: per-seed {metric} spread {got[1]:.4g}, the record says {given[1]}")
    return out


# ---- rendering ---------------------------------------------------------------------------

def _num(metric: str, value: tuple[float, float | None]) -> str:
    mean, spread = value
    if metric in ("final_minus_base", "vs_ref", "last_vs_ref"):
        text, tail = f"{mean:+.1f}", f"{spread:.1f}" if spread is not None else None
    elif metric in ("tokens_per_step", "wall_s"):
        text, tail = f"{mean:.0f}", f"{spread:.0f}" if spread is not None else None
    elif metric in LEARNT_FROM:
        digits = 1 if metric == "tasks_per_step" else 2
        text, tail = f"{mean:.{digits}f}", f"{spread:.{digits}f}" if spread is not None else None
    else:
        text, tail = f"{mean:.3f}", f"{spread:.3f}" if spread is not None else None
    return text if tail is None else f"{text} ± {tail}"


def _seeds(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(str(s) for s in seeds)


def cell(rec: dict, arm: dict, column: str) -> str:
    """One table cell of an arm."""
    per = arm.get("per_seed", {})
    if column == "seeds":
        return _seeds(arm["seeds"])
    if column == "verdict":
        return "–" if arm.get("reference") is None else verdict(rec, arm)
    if column in ("vs_ref", "last_vs_ref") and arm.get("reference") is None:
        return "reference" if column == "vs_ref" else "–"
    if column in ("base", "final", "wall_s") and column in per:
        digits = 0 if column == "wall_s" else 3
        return " / ".join(f"{x:.{digits}f}" for x in per[column])
    value = summary(rec, arm, column)
    return "–" if value is None else _num(column, value)


def _reference_name(rec: dict) -> str:
    """What the paired columns are against: the record's `reference_label`, else the name of
    its first reference arm."""
    refs = [a["reference"] for a in rec["arms"] if a.get("reference")]
    return rec.get("reference_label") or (refs[0] if refs else "the reference")


def _pass_k(rec: dict) -> str:
    """The k of the record's pass@k column (its arms' `pass_k`)."""
    ks = {a["pass_k"] for a in rec["arms"] if "pass_k" in a}
    return str(ks.pop()) if len(ks) == 1 else "k"


def record_table(rec: dict) -> str:
    """A record as the results page shows it: when, where and how it ran, its commands, the
    table, and any windows explored after the runs (labelled as such, never the verdict)."""
    ref = _reference_name(rec)
    cols = rec.get("columns", ["seeds", "mean_of_checks", "final_minus_base", "vs_ref", "verdict",
                               "last_vs_ref", "tokens_per_step"])
    cols = [*cols, *(c for c in LEARNT_FROM if c not in cols
                     and any(c in a.get("per_seed", {}) for a in rec["arms"]))]
    budget = f", {rec['budget']:,} generated tokens per step" if rec.get("budget") else ""
    head = (f"Measured {rec['date']} on build `{rec['build']}`{rec.get('build_note', '')}: "
            f"`{rec['env']}`, {rec['steps']} steps{budget}"
            + (f", {rec['conditions']}" if rec.get("conditions") else "") + ".")
    lines = [head, "", "```bash", *rec["commands"], "```", "",
             "| " + " | ".join(["method", *(COLUMNS[c].format(ref=ref, k=_pass_k(rec)) for c in cols)]) + " |",
             "|" + "---|" * (len(cols) + 1)]
    for arm in rec["arms"]:
        lines.append("| " + " | ".join([arm["label"], *(cell(rec, arm, c) for c in cols)]) + " |")
    explored = [f"{arm['label']} {window} {_num('vs_ref', tuple(v))}"
                for arm in rec["arms"] for window, v in arm.get("exploration", {}).items()]
    if explored:
        lines += ["", "Exploration (windows of checks chosen after the runs; not a verdict), "
                  f"paired vs {ref} in points: " + "; ".join(explored) + "."]
    return "\n".join(lines + _tuning_lines(rec.get("tuning"))) + "\n"


def _tuning_lines(tuning: dict | None) -> list[str]:
    """The tuning stage under a record's table: its seeds, each method's points with their
    scores (mean of checks, mean over the tuning seeds), the pick in bold."""
    if not tuning:
        return []
    out = []
    for m, d in tuning["methods"].items():
        pick = (d.get("pick") or {}).get("values")
        pts = [", ".join(f"{k.split('.')[-1]}={v}" for k, v in p["values"].items())
               + f" {p['score']:.3f}" for p in d["points"]]
        out.append(f"`{m}` " + "; ".join(f"**{x}**" if pick and d["points"][i]["values"] == pick
                                         else x for i, x in enumerate(pts)))
    seeds = ", ".join(str(s) for s in tuning["seeds"])
    return ["", f"Tuning stage (each method alike, seeds {seeds}; mean of checks, the pick in "
            "bold): " + " · ".join(out) + "."]


def _value(v) -> str:
    return json.dumps(v).strip('"')


def departures_table(rec: dict) -> str:
    """A record of kind `departures`: per recipe, where it departs from its paper, the `--set`
    that restores the paper's value, and the measured evidence (its date, build and log)."""
    lines = ["| recipe | departure | the paper's value | evidence |", "|---|---|---|---|"]
    for row in rec["rows"]:
        sets = " ".join(f"--set {k}={_value(v)}" for k, v in row["paper_values"].items())
        lines.append(f"| `{row['recipe']}` | {row['departure']} | `{sets}` | {row['evidence']} |")
    return "\n".join(lines) + "\n"


# ---- the README's numbers ------------------------------------------------------------------

MAIN, CLONE, METHODS = "search-main", "main-command-clone", "methods-search"
LONG, COMPACTION = "search-long-200", "search-long-compaction"
# FOCUS against GRPO wherever both ran at equal tokens: (setting, record, FOCUS's arm); on
# `search` the main command's runs (the newest build), the every-method sweep is on results.md
EXPECT = (("`search`, the main command", MAIN, "focus"), ("`search-long`", LONG, "focus-0-5"),
          ("`search-long-compaction`", COMPACTION, "focus"), ("`math`", "families-math", "focus"),
          ("`math`, tuned alike, GRPO's task count", "verdict-math", "focus"),
          ("`search`, tuned alike, GRPO's task count", "verdict-search", "focus"),
          ("`rules`", "families-rules", "focus"),
          ("`rules`, tuned alike, GRPO's task count", "verdict-rules", "focus"),
          ("`locate`", "families-locate", "focus"),
          ("`locate`, tuned alike, GRPO's task count", "verdict-locate", "focus"),
          ("`allocation-early`", "allocation-early", "focus"),
          ("`allocation-late`", "allocation-late", "focus"))


def _pair_text(rec: dict, arm: dict, metric: str = "vs_ref") -> str:
    return _num(metric, summary(rec, arm, metric))


def readme_expect(records: dict[str, dict]) -> str:
    """FOCUS against GRPO on every setting both ran: the paired difference of the mean of
    checks and the standard's word for it (none off the matched budget)."""
    lines = ["| FOCUS vs GRPO, equal tokens (build) | seeds | FOCUS - GRPO, mean of checks "
             "(points, paired) | verdict |", "|---|---|---|---|"]
    for what, key, name in EXPECT:
        rec = records[key]
        arm = _arm(rec, name)
        lines.append(f"| {what}, {rec['steps']} steps (`{rec['build']}`) | {_seeds(arm['seeds'])} | "
                     f"{_pair_text(rec, arm)} | {verdict(rec, arm)} |")
    return "\n".join(lines) + "\n"


def _walls(arm: dict) -> str:
    return " / ".join(f"{x:.0f}" for x in arm["per_seed"]["wall_s"])


def readme_cost(records: dict[str, dict]) -> str:
    """Wall time of the main command and GRPO, from one table, what the main command's runs
    reached, and the alone run."""
    main, clone = records[MAIN], records[CLONE]
    g, f = _arm(main, "grpo"), _arm(main, "focus")
    return "\n".join([
        f"| a {main['steps']}-step run on `{main['env']}`, one thread (`{main['build']}`) | GRPO | "
        "FOCUS | FOCUS / GRPO |", "|---|---|---|---|",
        f"| wall s, seeds {_seeds(f['seeds'])}, two runs at a time on 2 cores | "
        f"{_walls(g)} | {_walls(f)} | {wall_ratio(main, 'focus', 'grpo'):.2f}x |",
        f"| held-out success, base → step {main['steps']}, seeds {_seeds(f['seeds'])} | – | "
        + " / ".join(f"{b:.3f} → {t:.3f}" for b, t in zip(f["per_seed"]["base"], f["per_seed"]["final"]))
        + " | – |",
        f"| training s, seed 0, fresh clone (`{clone['build']}`) | – | "
        f"{_walls(clone['arms'][0])} | – |"]) + "\n"


# the paper's four task families at CPU scale: (env, record); search's is the every-method table
FAMILIES = (("search", METHODS), ("math", "families-math"), ("rules", "families-rules"),
            ("locate", "families-locate"))
FAMILY_METHODS = ("focus", "vineppo", "ppo", "mpo", "trace")
FAMILY_LABELS = ("FOCUS", "VinePPO", "PPO", "MPO", "TRACE")


def _family_cell(rec: dict, name: str) -> str:
    arm = next((a for a in rec["arms"] if a["name"] == name), None)
    if arm is None:
        return "not run"
    word = verdict(rec, arm)
    diff = summary(rec, arm, "vs_ref")
    return word if diff is None or word.startswith("off") else f"{_num('vs_ref', diff)} {word}"


def families(records: dict[str, dict]) -> str:
    """One row per task family: GRPO's gain over its start, then FOCUS, VinePPO, PPO, MPO and
    TRACE against GRPO (paired mean of checks, points, with the verdict word); a family
    without a record, or a method its record lacks, is said to be not run."""
    lines = ["| family | build | seeds | GRPO: mean of checks | GRPO: last - base (points) | "
             + " | ".join(f"{m} vs grpo (points, paired)" for m in FAMILY_LABELS) + " |",
             "|" + "---|" * (5 + len(FAMILY_METHODS))]
    for env, key in FAMILIES:
        rec = records.get(key)
        if rec is None:
            lines.append(f"| `{env}` | – | – | not run | – |" + " – |" * len(FAMILY_METHODS))
            continue
        g = _arm(rec, "grpo")
        lines.append(f"| `{env}` | `{rec['build']}` | {_seeds(g['seeds'])} | "
                     f"{cell(rec, g, 'mean_of_checks')} | {cell(rec, g, 'final_minus_base')} | "
                     + " | ".join(_family_cell(rec, m) for m in FAMILY_METHODS) + " |")
    return "\n".join(lines) + "\n"


# task suites from outside the repository (reasoning-gym): (task, record)
EXTERNAL = (("reasoning-gym:chain_sum", "rg-chain-sum"), ("reasoning-gym:leg_counting", "rg-leg-counting"))


def external(records: dict[str, dict]) -> str:
    """One row per external task: its build, seeds, the start (base), GRPO's mean of checks and
    gain, and FOCUS against GRPO (paired mean of checks, points, with the verdict word)."""
    lines = ["| task | build | seeds | base | GRPO: mean of checks | GRPO: last - base (points) "
             "| FOCUS vs grpo (points, paired) |", "|---|---|---|---|---|---|---|"]
    for task, key in EXTERNAL:
        rec = records.get(key)
        if rec is None:
            lines.append(f"| `{task}` | – | – | – | not run | – | – |")
            continue
        g = _arm(rec, "grpo")
        lines.append(f"| `{task}` | `{rec['build']}` | {_seeds(g['seeds'])} | {cell(rec, g, 'base')} | "
                     f"{cell(rec, g, 'mean_of_checks')} | {cell(rec, g, 'final_minus_base')} | "
                     f"{_family_cell(rec, 'focus')} |")
    return "\n".join(lines) + "\n"


# FOCUS's pre-registered verdict (docs/log/2026-12-07-focus-verdict-pre-registration.md):
# (family, record), each an `agentrl ablate --tune` sweep of grpo and focus
VERDICT = (("math", "verdict-math"), ("rules", "verdict-rules"), ("search", "verdict-search"),
           ("locate", "verdict-locate"))
VERDICT_AHEAD = 3.0          # points: the bar's "ahead on at least one family"


def _pair_of(rec: dict, metric: str, digits: int) -> str:
    """GRPO's and FOCUS's mean over seeds of a per-seed metric, "g / f", "–" where missing."""
    out = []
    for name in ("grpo", "focus"):
        xs = _arm(rec, name).get("per_seed", {}).get(metric)
        out.append(f"{statistics.mean(xs):.{digits}f}" if xs else "–")
    return " / ".join(out)


def _picks(rec: dict) -> str:
    """Each method's tuned values (its pick of the record's tuning stage), "GRPO / FOCUS"."""
    methods = (rec.get("tuning") or {}).get("methods", {})
    out = []
    for name in ("grpo", "focus"):
        pick = (methods.get(name) or {}).get("pick")
        out.append(", ".join(f"{v}" for v in pick["values"].values()) if pick else "–")
    return " / ".join(out)


def verdict_outcome(records: dict[str, dict]) -> str:
    """The bar of the pre-registration: FOCUS never behind GRPO (paired mean of checks) on any
    family and 3 or more points ahead on one; "open" while a family has no record."""
    missing = [env for env, key in VERDICT if key not in records]
    short, ahead = [], []
    for env, key in VERDICT:
        if key in records:
            rec = records[key]
            arm = _arm(rec, "focus")
            word, diff = verdict(rec, arm), summary(rec, arm, "vs_ref")
            if word != "ahead" and word != "level":
                short.append(f"`{env}` ({word})")
            elif word == "ahead" and diff[0] >= VERDICT_AHEAD:
                ahead.append(env)
    if short:
        return "**not met**: behind or off the budget on " + ", ".join(short)
    if missing:
        return "**open**: not run on " + ", ".join(f"`{e}`" for e in missing)
    return "**met**" if ahead else f"**not met**: {VERDICT_AHEAD:.0f} points ahead on no family"


def focus_verdict(records: dict[str, dict]) -> str:
    """One row per family of the pre-registered verdict: the tuned learning rates, GRPO's mean
    of checks, FOCUS against GRPO (paired, points, the verdict word), tokens, tasks and
    mixed-outcome groups per step of each; then the bar's outcome."""
    lines = ["| family | build | seeds | tuned (GRPO / FOCUS) | GRPO: mean of checks | FOCUS vs grpo "
             "(points, paired) | tokens / step | tasks / step | mixed-outcome groups |",
             "|---|---|---|---|---|---|---|---|---|"]
    for env, key in VERDICT:
        rec = records.get(key)
        if rec is None:
            lines.append(f"| `{env}` | – | – | – | not run | – | – | – | – |")
            continue
        g = _arm(rec, "grpo")
        lines.append(f"| `{env}` | `{rec['build']}` | {_seeds(g['seeds'])} | {_picks(rec)} | "
                     f"{cell(rec, g, 'mean_of_checks')} | {_family_cell(rec, 'focus')} | "
                     f"{_pair_of(rec, 'tokens_per_step', 0)} | {_pair_of(rec, 'tasks_per_step', 1)} | "
                     f"{_pair_of(rec, 'mixed_outcome_share', 2)} |")
    return "\n".join(lines) + f"\n\nThe bar: {verdict_outcome(records)}.\n"


SECTIONS = {"families": families,
            "external": external,
            "focus-verdict": focus_verdict,
            "readme-expect": readme_expect,
            "readme-cost": readme_cost}


def render(key: str, records: dict[str, dict]) -> str:
    """A generated section's text: `table:NAME` is record NAME's table, else a README section."""
    if key.startswith("table:"):
        rec = records[key.split(":", 1)[1]]
        return departures_table(rec) if rec.get("kind") == "departures" else record_table(rec)
    return SECTIONS[key](records)


def fill(text: str, records: dict[str, dict]) -> str:
    """`text` with every generated section rewritten from the records."""
    for key in SECTION.findall(text):
        begin, end = BEGIN.format(key=key), END.format(key=key)
        if begin not in text or end not in text:
            raise ValueError(f"generated section {key}: begin or end marker missing")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + begin + "\n" + render(key, records) + end + tail
    return text


PAGES = ("README.md", "docs/results.md", "docs/results-runs.md")
# every record is shown on one of the results pages: its own table, or a row of a summary table
RESULTS_PAGES = ("docs/results.md", "docs/results-runs.md")
PAGE_END = "<!-- end of page -->"    # a page's last line: a page cut short lacks it
# the generated sections each page must hold (results.md also one `table:NAME` per record)
REQUIRED = {"README.md": ("readme-cost", "readme-expect"), "docs/results.md": ("families",)}

# Numbers that prose quotes from records (`record_quotes`): (page, the sentence with each
# number as {RECORD:budget}, {RECORD:ARM:METRIC[:mean|:abs]}, {RECORD:ARM:verdict},
# {RECORD:ARM:off_budget} or {RECORD:ARM:vs:OTHER_ARM} (paired mean of checks, points)).
QUOTES = (
    ("docs/results.md", "on `rules` {families-rules:grpo:final_minus_base} from "
     "{families-rules:grpo:base:mean}"),
    ("docs/results.md", "FOCUS with the learned critic is **{allocation-early:focus:verdict}** "
     "with GRPO ({allocation-early:focus:vs_ref} points), not 3 points ahead; ahead of "
     "`tree_grpo` ({allocation-early:focus:vs:tree_grpo}), itself "
     "{allocation-early:tree_grpo:verdict} GRPO"),
    ("docs/results.md", "at step 0: {search-main:budget} tokens for seed 0"),
    ("docs/results.md", "reasoning-gym](envs.md#reasoning-gym-tasks-reasoning-gymname) generators, "
     "{rg-chain-sum:budget} tokens a step"),
    ("docs/methods.md", "`search` ({methods-search:focus:vs_ref}, 3 seeds), `search-long` "
     "({search-long-200:focus-0-5:vs_ref}, 6 seeds) and on `allocation-early` "
     "({allocation-early:focus:vs_ref}, 6 seeds)"),
    ("docs/methods.md", "it is level too ({allocation-early:focus-oracle:vs_ref})"),
    ("docs/methods.md", "on `math` ({families-math:focus:vs_ref}), `rules` "
     "({families-rules:focus:vs_ref}) and `locate` ({families-locate:focus:vs_ref})"),
    ("docs/methods.md", "first stayed {allocation-late:focus-contrast:vs_ref:abs} points behind GRPO"),
    ("docs/methods.md", "on `allocation-early` ({allocation-early:focus:vs:tree_grpo}), which is "
     "behind GRPO there ({allocation-early:tree_grpo:vs_ref})"),
    ("docs/methods.md", "is level with GRPO ({allocation-ladder:focus-kappa0:vs_ref}); entropy "
     "branching (`algo.focus_allocator=entropy`) is behind ({allocation-ladder:focus-entropy:vs_ref})"),
    ("docs/methods.md", "tokens per step at its budget of {methods-search:budget}"),
    ("docs/methods.md", "FOCUS is still behind by {verdict-math:focus:vs_ref} points (six seeds"),
    ("docs/methods.md", "on `search` it is ahead by {verdict-search:focus:vs_ref} points (six seeds"),
    ("docs/methods.md", "and on `rules` by {verdict-rules:focus:vs_ref} (six seeds, both at 2e-4"),
    ("docs/envs.md", "budget ({search-long-200:budget} generated tokens"),
)


def quoted(records: dict[str, dict], ref: str) -> str:
    """The text of a quote's placeholder `ref` (see QUOTES) from the records."""
    name, *rest = ref.split(":")
    rec = records[name]
    if rest == ["budget"]:
        return f"{rec['budget']:,}"
    arm, what, *mods = rest
    a = _arm(rec, arm)
    if what == "verdict":
        return verdict(rec, a)
    if what == "off_budget":
        return f"{abs(100 * (off_budget(rec, a) or 0)):.0f}%"
    if what == "vs":
        b = _arm(rec, mods[0])
        per = lambda x: {s: 100 * v for s, v in zip(x["seeds"], x["per_seed"]["mean_of_checks"])}  # noqa: E731
        return _num("vs_ref", paired_difference(per(a), per(b))[:2])
    text = _num(what, summary(rec, a, what))
    if "mean" in mods:
        text = text.split(" ±")[0]
    return text.lstrip("+-") if "abs" in mods else text


def _read_page(root: Path, page: str) -> tuple[str | None, list[str]]:
    """(the page's text, or None; [its problems: missing, unreadable, empty, cut short])."""
    try:
        text = (root / page).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, [f"{page}: missing (python -m agentrl_cli.reporting.records checks it)"]
    except (OSError, UnicodeDecodeError) as e:
        return None, [f"{page}: cannot be read ({type(e).__name__})"]
    if not text.strip():
        return None, [f"{page}: empty"]
    if page in PAGES and text.rstrip().rsplit("\n", 1)[-1].strip() != PAGE_END:
        return text, [f"{page}: truncated (its last line is not {PAGE_END})"]
    return text, []


def marker_problems(page: str, text: str, records: dict[str, dict]) -> list[str]:
    """Sections without both markers, sections naming no record, sections a page must hold."""
    begins, ends = SECTION.findall(text), re.findall(r"<!-- end: (\S+) -->", text)
    out = [f"{page}: section {k} has no end marker ({END.format(key=k)})" for k in begins if k not in ends]
    out += [f"{page}: section {k} has no begin marker ({BEGIN.format(key=k)})" for k in ends if k not in begins]
    out += [f"{page}: section {k} names no record in docs/records" for k in begins
            if k.startswith("table:") and k.split(":", 1)[1] not in records]
    out += [f"{page}: section {k} is not one the records write" for k in begins
            if not k.startswith("table:") and k not in SECTIONS]
    need = list(REQUIRED.get(page, ()))
    out += [f"{page}: no generated section {k} (cut short, or its markers removed)"
            for k in need if k not in begins and k not in ends]
    return out


def shown_problems(texts: dict[str, str], records: dict[str, dict]) -> list[str]:
    """Every record shown on a results page (`texts`: page -> text): its own table, or a row of
    the table of task suites from outside or of FOCUS's verdict."""
    keys = {k for text in texts.values() for k in [*SECTION.findall(text),
                                                    *re.findall(r"<!-- end: (\S+) -->", text)]}
    rows, verdicts = {key for _, key in EXTERNAL}, {key for _, key in VERDICT}
    need = [f"table:{name}" for name in records if name not in rows | verdicts]
    need += ["external"] if rows & set(records) else []
    need += ["focus-verdict"] if verdicts & set(records) else []
    return [f"docs/results.md: no generated section {k} on {' or '.join(RESULTS_PAGES)} "
            "(cut short, or its markers removed)" for k in need if k not in keys]


def _render_problem(page: str, text: str, records: dict[str, dict]) -> str | None:
    """None when the page's sections render from the records and agree with them."""
    try:
        same = fill(text, records) == text
    except (KeyError, StopIteration, TypeError, ValueError, ZeroDivisionError, IndexError) as e:
        return (f"{page}: its sections cannot be rendered from docs/records "
                f"({type(e).__name__}: {str(e).strip(chr(39))})")
    return None if same else (f"{page}: generated sections disagree with docs/records "
                              "(python -m agentrl_cli.reporting.records rewrites them)")


def quote_problems(page: str, text: str, records: dict[str, dict]) -> list[str]:
    """A quote of QUOTES on `page` that is gone, or whose numbers are not the records'."""
    out = []
    for where, template in QUOTES:
        if where != page:
            continue
        try:
            m, wrong = compare(text, template, lambda ref: quoted(records, ref))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            out.append(f"{page}: a quote of the records cannot be rendered ({type(e).__name__}: "
                       f"{str(e).strip(chr(39))}): {short(template)}")
            continue
        if m is None:
            out.append(f"{page}: a quote of the records is gone or reworded (change QUOTES in "
                       f"agentrl_cli/reporting/records.py with it): {short(template)}")
        out += [f"{page}: '{got}' where docs/records gives '{want}' ({ref})" for ref, got, want in wrong]
    return out


def problems(root: Path) -> list[str]:
    """Every problem of the records and the pages built from them under `root`, one line
    each (the module's docstring lists them)."""
    try:
        records = load_records(root / "docs" / "records")
    except RecordError as e:
        return [str(e)] + [p for page in PAGES for p in _read_page(root, page)[1]]
    if not records:
        return ["docs/records: no records"]
    out, results = [], {}
    for page in dict.fromkeys([*PAGES, *(p for p, _ in QUOTES)]):
        text, found = _read_page(root, page)
        out += found
        if text is None:
            continue
        if page in RESULTS_PAGES:
            results[page] = text
        if page in PAGES:
            marks = marker_problems(page, text, records)
            out += marks
            if not marks:
                out += [p for p in [_render_problem(page, text, records)] if p]
        out += quote_problems(page, text, records)
    return out + (shown_problems(results, records) if len(results) == len(RESULTS_PAGES) else [])


def stale(root: Path) -> list[str]:
    """The pages under `root` whose generated sections disagree with docs/records."""
    records = load_records(root / "docs" / "records")
    return [p for p in PAGES if fill((root / p).read_text(), records) != (root / p).read_text()]


def write(root: Path) -> list[Path]:
    """Rewrite the generated sections and the quoted numbers of the pages under `root`;
    returns what changed."""
    records = load_records(root / "docs" / "records")
    changed = []
    for page in dict.fromkeys([*PAGES, *(p for p, _ in QUOTES)]):
        path = root / page
        old = path.read_text()
        text = fill(old, records) if page in PAGES else old
        for _, template in (q for q in QUOTES if q[0] == page):
            text = rewrite(text, template, lambda ref: quoted(records, ref))
        if text != old:
            path.write_text(text)
            changed.append(path)
    return changed


def main(argv: list[str]) -> int:
    root = Path.cwd()
    found = problems(root)
    if "--check" in argv:
        for line in found:
            print(line)
        return 1 if found else 0
    fixable = ("generated sections disagree", "where docs/records gives")
    blocking = [p for p in found if not any(f in p for f in fixable)]
    for line in blocking:
        print(line, file=sys.stderr)
    if blocking:
        return 1
    for path in write(root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
