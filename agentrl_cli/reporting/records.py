"""Measured results from records: `docs/records/*.json` hold one measured set of runs each (its
commands, build, date, env, budget, steps and the per-seed values of each metric the pages
quote); this module derives the numbers the pages print (means, paired differences over seeds
± their standard error, the verdict words) and writes them between generated-section markers
in `docs/results.md` and `README.md`. It reads JSON only.

    python -m agentrl_cli.reporting.records          # rewrite the generated sections
    python -m agentrl_cli.reporting.records --check  # exit 1 naming each stale section

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
           "pass_at_k": "pass@{k} at the end"}
BEGIN = "<!-- from docs/records: {key} -->"     # python -m agentrl_cli.reporting.records
END = "<!-- end: {key} -->"
SECTION = re.compile(r"<!-- from docs/records: (\S+) -->")


def load_records(folder: Path) -> dict[str, dict]:
    """Every record under `folder`, by file stem; a record that fails `check_record` raises."""
    out = {}
    for path in sorted(Path(folder).glob("*.json")):
        rec = json.loads(path.read_text())
        problems = check_record(rec)
        if problems:
            raise ValueError(f"{path.name}: " + "; ".join(problems))
        out[path.stem] = rec
    return out


# ---- derived numbers -------------------------------------------------------------------

def _scale(metric: str) -> float:
    return 100.0 if metric in ("vs_ref", "last_vs_ref") else 1.0


def _arm(rec: dict, name: str) -> dict:
    return next(a for a in rec["arms"] if a["name"] == name)


def paired_difference(mine: dict, theirs: dict) -> tuple[float, float, int] | None:
    """The page's comparison: (mean, standard error, seeds) of `mine[seed] - theirs[seed]`
    over the seeds both have (two or more), else None. `benchmarks/methods_table.py` uses it
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


def check_record(rec: dict) -> list[str]:
    """What is wrong with a record: missing fields, per-seed lists of the wrong length, a
    reference that is not an arm, per-seed values that do not give the summary beside them."""
    if rec.get("kind") == "departures":
        return _check_departures(rec)
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
    return "\n".join(lines) + "\n"


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
          ("`rules`", "families-rules", "focus"), ("`locate`", "families-locate", "focus"),
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


SECTIONS = {"families": families,
            "external": external,
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


PAGES = ("README.md", "docs/results.md")


def stale(root: Path) -> list[str]:
    """The pages under `root` whose generated sections disagree with docs/records."""
    records = load_records(root / "docs" / "records")
    return [p for p in PAGES if fill((root / p).read_text(), records) != (root / p).read_text()]


def write(root: Path) -> list[Path]:
    """Rewrite the generated sections of the pages under `root`; returns what changed."""
    records = load_records(root / "docs" / "records")
    changed = []
    for page in PAGES:
        path = root / page
        text = fill(path.read_text(), records)
        if text != path.read_text():
            path.write_text(text)
            changed.append(path)
    return changed


def main(argv: list[str]) -> int:
    root = Path.cwd()
    if "--check" in argv:
        bad = stale(root)
        for page in bad:
            print(f"{page}: generated sections disagree with docs/records "
                  "(python -m agentrl_cli.reporting.records rewrites them)")
        return 1 if bad else 0
    for path in write(root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
