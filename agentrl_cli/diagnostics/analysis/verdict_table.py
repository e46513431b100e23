"""The verdict table of docs/results.md (`agentrl diagnose table`): one row per method (or sweep
cell) over its seeds, each compared with a reference method seed by seed; `record` writes the
same runs as a docs/records entry.

Columns: the mean of a run's held-out checks after step 0 (mean ± sample std over seeds), the
final check minus the base (step 0), the paired difference of the mean of checks against the
reference method on the same seeds (mean ± its standard error, std / sqrt(seeds)) and the
verdict it gives (ahead / behind when the difference exceeds its standard error, else level),
the same paired difference at the last check, generated tokens per training step, pass@k of the
last checkpoint (`eval-pass-at-k.json`, written by `--pass-k`), the distinct tasks a step learnt
from (over the traced steps), the share of a step's groups (GRPO groups, a task's tree) whose
outcomes differ (mixed-outcome groups: those with a learning signal), where a tree method
launched its continuations (the share at depth 0, the root, at depth 1 and deeper), the
critic's rank of a tree's states (`focus/critic_rank`, mean over steps), generated tokens per
held-out question at the last check, seconds per training step and the mean standard error of
one check (task-clustered, when the run logged it)."""
from __future__ import annotations

import datetime
import json
import statistics
import subprocess
from collections import defaultdict
from pathlib import Path

from ...errors import ConfigError
from ...reporting.records import paired_difference, verdict_word
from ...reporting.run_reader import RunFolder, read_run, runs_under

PASS_FILE = "eval-pass-at-k.json"      # `agentrl eval --json` of the run's last checkpoint
SOURCE = "made from run folders by agentrl diagnose table --record"


def load_run(run: Path, lo: int = 1, hi: int | None = None) -> dict | None:
    """A finished run's numbers (None without summary.json); the mean of checks over the checks
    at steps lo..hi (default: every check after step 0)."""
    folder = read_run(run)
    if folder is None:
        return None
    summary, steps = folder.summary, folder.steps()
    checks = {r["step"]: r for r in folder.checks()}
    last = max(checks)
    zero_spread = logged_mean(steps, "rollout/zero_spread_groups")
    return {"label": folder.label, "seed": summary["seed"], "base": checks[0]["eval/success"],
            "final": checks[last]["eval/success"],
            "mean_checks": statistics.mean(r["eval/success"] for s, r in checks.items()
                                           if max(lo, 1) <= s <= (hi if hi is not None else s)),
            "tokens_per_step": statistics.mean(r["rollout/tokens"] for r in steps),
            "tpq": checks[last]["eval/tokens_per_question"],
            # the share of a step's groups (a GRPO group, a task's tree) whose outcomes differ
            "mixed": None if zero_spread is None else 1 - zero_spread,
            "depths": launch_depths(steps),
            # the critic's rank of the tree's states against their own outcomes
            "critic_rank": logged_mean(steps, "focus/critic_rank"),
            "tasks": tasks_per_step(folder),
            "pass_k": pass_at_k(folder.folder),
            "summary": summary, "steps": summary.get("steps", last),
            "s_per_step": statistics.mean(r["time/step"] for r in steps if "time/step" in r),
            "se": statistics.mean(r["eval/success_se"] for r in checks.values())
            if all("eval/success_se" in r for r in checks.values()) else None}


def logged_mean(steps: list[dict], key: str) -> float | None:
    """The mean of `key` over the steps that logged it; None when none did."""
    values = [r[key] for r in steps if key in r]
    return statistics.mean(values) if values else None


def pass_at_k(run: Path) -> tuple[int, float] | None:
    """(k, pass@k) of the run's last checkpoint from its `eval-pass-at-k.json`, k the largest
    evaluated; None before `--pass-k` wrote it."""
    f = run / PASS_FILE
    if not f.is_file():
        return None
    res = json.loads(f.read_text())["pass@k"]
    k = max(res, key=int)
    return int(k), res[k]


def evaluate_pass_at_k(run: Path, k: int) -> None:
    """`agentrl eval --pass-k k --n k` of the run's last checkpoint on the held-out tasks of its
    checks, written to `PASS_FILE` (kept: a rerun of the table reads it)."""
    done = pass_at_k(run)
    if done is not None and done[0] == k:
        return
    subprocess.run(["agentrl", "eval", "--checkpoint", str(run), "--pass-k", str(k), "--n", str(k),
                    "--json", str(run / PASS_FILE)], check=True, capture_output=True)


def evaluate_pass_at_k_under(paths: list[Path], k: int) -> None:
    """`evaluate_pass_at_k` of every finished run under `paths`."""
    for p in runs_under(paths):
        if (p / "summary.json").is_file():
            evaluate_pass_at_k(p, k)


def pass_at_k_values(rs: list[dict]) -> tuple[int, list[float]] | None:
    """(k, each run's pass@k) when every run of `rs` was evaluated at the same k, else None."""
    ks = {r["pass_k"][0] if r["pass_k"] is not None else None for r in rs}
    if len(ks) != 1 or None in ks:
        return None
    return ks.pop(), [r["pass_k"][1] for r in rs]


def tasks_per_step(run: RunFolder) -> float | None:
    """Distinct tasks a training step learnt from, over the run's traced steps: a tree method's
    trees, else its episodes / `rollout.group_size` (GRPO draws fresh tasks to spend its budget);
    None without traces or a config."""
    if run.config is None:
        return None
    group = run.config["rollout"]["group_size"]
    counts = [t["trees_in_step"] or t["episodes_in_step"] / group for t in run.traces()]
    return statistics.mean(counts) if counts else None


def launch_depths(steps: list[dict]) -> dict[int, float] | None:
    """The mean share of a step's continuations launched at each depth (0: the root, before
    the first decision; a tree method's `focus/launch_share_depth*`), over the steps; None for
    a run that launches none (a linear method)."""
    shares = defaultdict(float)
    n = 0
    for r in steps:
        row = {int(k.removeprefix("focus/launch_share_depth")): v for k, v in r.items()
               if k.startswith("focus/launch_share_depth")}
        if row:
            n += 1
            for d, v in row.items():
                shares[d] += v
    return {d: shares[d] / n for d in sorted(shares)} if n else None


def depth_cell(rs: list[dict]) -> str:
    """Continuations by depth over a method's seeds: `d0 .40 d1 .35 d2+ .25`."""
    rows = [r["depths"] for r in rs if r["depths"]]
    if not rows:
        return "–"
    mean = lambda d: statistics.mean(row.get(d, 0.0) for row in rows)  # noqa: E731
    deep = statistics.mean(sum(v for k, v in row.items() if k >= 2) for row in rows)
    return f"d0 {mean(0):.2f} d1 {mean(1):.2f} d2+ {deep:.2f}"


def paired(runs: list[dict], ref: list[dict], key: str = "mean_checks") -> tuple[float, float, int] | None:
    """(mean, standard error, seeds) of the differences in `key` (default the mean of checks)
    on the seeds both share."""
    return paired_difference({r["seed"]: r[key] for r in runs}, {r["seed"]: r[key] for r in ref})


def verdict(diff: tuple[float, float, int] | None) -> str:
    return "–" if diff is None else verdict_word(*diff[:2])


def _ms(xs: list[float], scale: float = 1.0, digits: int = 3, sign: str = "") -> str:
    xs = [x * scale for x in xs]
    if len(xs) == 1:
        return f"{xs[0]:{sign}.{digits}f}"
    return f"{statistics.mean(xs):{sign}.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


def _pass_cell(passed: tuple[int, list[float]] | None) -> str:
    return "–" if passed is None else f"@{passed[0]} " + _ms(passed[1])


def _all(rs: list[dict], key: str, digits: int) -> str:
    """`key` over the seeds (mean ± std) when every run has it, else –."""
    return _ms([r[key] for r in rs], digits=digits) if all(r[key] is not None for r in rs) else "–"


HEAD = ["method", "seeds", "mean of checks", "final - base (points)",
        "vs {ref} (points, paired)", "verdict", "last check vs {ref}",
        "gen. tokens / step", "pass@k at the end", "tasks / step", "mixed-outcome groups",
        "continuations by depth", "critic rank (rho)",
        "tokens / eval question", "s / step", "se of one check"]


def _by_label(runs: list[dict]) -> dict[str, list[dict]]:
    by = defaultdict(list)
    for r in runs:
        by[r["label"]].append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in by.items()}


def _row(label: str, rs: list[dict], ref: list[dict] | None, is_ref: bool) -> str:
    """One label's row: `ref` the reference's runs (None for the reference itself, or when the
    runs hold no reference)."""
    diff = None if ref is None else paired(rs, ref)
    last = None if ref is None else paired(rs, ref, "final")
    ses = [r["se"] for r in rs if r["se"] is not None]
    return "| " + " | ".join([
        f"`{label}`", ",".join(str(r["seed"]) for r in rs),
        _ms([r["mean_checks"] for r in rs]),
        _ms([r["final"] - r["base"] for r in rs], 100, 1, "+"),
        "reference" if is_ref else
        ("–" if diff is None else f"{100 * diff[0]:+.1f} ± {100 * diff[1]:.1f}"),
        "–" if is_ref else verdict(diff),
        "–" if last is None else f"{100 * last[0]:+.1f} ± {100 * last[1]:.1f}",
        _ms([r["tokens_per_step"] for r in rs], digits=0),
        _pass_cell(pass_at_k_values(rs)),
        _all(rs, "tasks", 1), _all(rs, "mixed", 2), depth_cell(rs), _all(rs, "critic_rank", 2),
        _ms([r["tpq"] for r in rs], digits=1),
        _ms([r["s_per_step"] for r in rs], digits=2),
        f"{statistics.mean(ses):.3f}" if ses else "–"]) + " |"


def table(runs: list[dict], reference: str) -> list[str]:
    """The table's lines: a header, then one row per label, the best mean of checks first."""
    by = _by_label(runs)
    head = [h.format(ref=reference) for h in HEAD]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in sorted(by, key=lambda k: -statistics.mean(r["mean_checks"] for r in by[k])):
        ref = None if label == reference or reference not in by else by[reference]
        lines.append(_row(label, by[label], ref, label == reference))
    return lines


def _build() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _one(runs: list[dict], key: str):
    values = {r["summary"].get(key) for r in runs}
    return values.pop() if len(values) == 1 else None


def _arm(label: str, rs: list[dict]) -> dict:
    """One record arm: the per-seed values of each metric every seed of it has."""
    per = {"base": [r["base"] for r in rs], "final": [r["final"] for r in rs],
           "mean_of_checks": [r["mean_checks"] for r in rs],
           "tokens_per_step": [r["tokens_per_step"] for r in rs]}
    arm = {"name": label, "label": f"`{label}`", "seeds": [r["seed"] for r in rs], "per_seed": per}
    passed = pass_at_k_values(rs)
    if passed is not None:
        arm["pass_k"], per["pass_at_k"] = passed
    if all(r["summary"].get("wall_seconds") is not None for r in rs):
        per["wall_s"] = [r["summary"]["wall_seconds"] for r in rs]
    for key, metric in (("tasks", "tasks_per_step"), ("mixed", "mixed_outcome_share")):
        if all(r[key] is not None for r in rs):
            per[metric] = [r[key] for r in rs]
    return arm


def tuning_of(paths: list[Path]) -> dict | None:
    """The tuning stage of the given ablate folders (`agentrl ablate --tune`: their
    `tuning.json`: the rule, the exploration seeds, each method's grid, every tuning run's mean
    of checks and each method's pick), or None without one; ConfigError for two (a record holds
    one sweep's tuning) or an unfinished one (a method without its pick)."""
    found = [Path(p) / "tuning.json" for p in paths if (Path(p) / "tuning.json").is_file()]
    if not found:
        return None
    if len(found) > 1:
        raise ConfigError("--record: more than one of the folders holds a tuning stage "
                          f"({', '.join(str(f.parent) for f in found)}); record one sweep at a time")
    tuning = json.loads(found[0].read_text())
    unfinished = [m for m, d in tuning.get("methods", {}).items() if d.get("pick") is None]
    if unfinished:
        raise ConfigError(f"--record: the tuning stage of {found[0].parent} has no pick yet for "
                          f"{', '.join(unfinished)} (resume the sweep first)")
    return tuning


def record(runs: list[dict], reference: str, commands: list[str], title: str,
           build: str | None = None, date: str | None = None, tuning: dict | None = None) -> dict:
    """The runs as a docs/records entry: one arm per method (or cell) with its per-seed values
    (tasks a step learnt from and the mixed-outcome share where every seed has them), paired
    with `reference` when the runs hold it; the sweep's tuning stage (`tuning_of`) as given."""
    by = _by_label(runs)
    arms = []
    for label in sorted(by, key=lambda k: (k != reference, k)):
        arm = _arm(label, by[label])
        if label != reference and reference in by:
            arm["reference"] = reference
        arms.append(arm)
    return {"title": title, "date": date or datetime.date.today().isoformat(),
            "build": build or _build(), "env": _one(runs, "env"),
            "budget": _one(runs, "budget_tokens") or None,
            "steps": max(r["steps"] for r in runs), "commands": commands,
            "source": SOURCE, "arms": arms, **({"tuning": tuning} if tuning else {})}


def check_window(checks: str | None) -> tuple[int, int | None]:
    """`--checks LO-HI` as (LO, HI); every check after the base without it."""
    if not checks:
        return 1, None
    try:
        lo, hi = (int(x) for x in checks.split("-"))
    except ValueError:
        raise ConfigError(f"--checks {checks}: give LO-HI, two step numbers") from None
    return lo, hi


def load_runs(paths: list[Path], lo: int = 1, hi: int | None = None) -> list[dict]:
    """Every finished run under `paths` (run folders or ablate folders); ConfigError when none."""
    runs = [r for r in (load_run(p, lo, hi) for p in runs_under(paths)) if r is not None]
    if not runs:
        raise ConfigError("no finished runs (summary.json) among the given folders")
    return runs
