"""One story in the docs: every measured number the README shows comes from a record through a
generated section, the guides quote the records' numbers, the recipe departures table is the
recipes' own settings, every verdict on the results page states its prediction, and the
coming-from page's adapter runs the way agentrl calls a reward function."""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from agentrl_cli import config
from agentrl_cli.reporting import records
from agentrl_cli.rollout import rewards

from test_records import _copy   # the pages and records in a scratch repository root

ROOT = Path(__file__).resolve().parents[1]
# a measured number: a difference or success ± its spread, a success fraction, a time ratio
MEASURED = re.compile(r"[+-]?\d+\.\d+ ± \d|\b0\.\d{3}\b|\b\d\.\d\dx\b")


def _loose_numbers(text: str) -> list[str]:
    """Measured numbers in `text` outside generated sections and code blocks (a command's
    printed output there is an example, not a result)."""
    for key in records.SECTION.findall(text):
        head, rest = text.split(records.BEGIN.format(key=key), 1)
        text = head + rest.split(records.END.format(key=key), 1)[1]
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return MEASURED.findall(text)


def test_every_measured_number_of_the_readme_comes_from_a_record():
    readme = (ROOT / "README.md").read_text()
    assert _loose_numbers(readme) == []
    assert records.stale(ROOT) == []
    # a number typed into the README's prose instead of a generated section is caught
    planted = readme.replace("**What to expect.**", "**What to expect.** FOCUS gains 0.696,", 1)
    assert _loose_numbers(planted) == ["0.696"]


def test_the_readmes_verdict_table_follows_its_records(tmp_path):
    """What to expect: FOCUS against GRPO per setting, the verdict on the records' standard;
    a record that changes moves the README's row."""
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `allocation-late`"))
    assert row.endswith("| -6.2 ± 2.0 | off the budget (+5% tokens) |")
    root = _copy(tmp_path)
    path = root / "docs" / "records" / "allocation-late.json"
    rec = json.loads(path.read_text())
    focus = next(a for a in rec["arms"] if a["name"] == "focus")
    focus["per_seed"]["tokens_per_step"] = [2377.0] * 6            # at the budget
    path.write_text(json.dumps(rec))
    assert records.stale(root) == ["README.md", "docs/results.md"]
    records.write(root)
    row = next(line for line in (root / "README.md").read_text().splitlines()
               if line.startswith("| `allocation-late`"))
    assert row.endswith("| -6.2 ± 2.0 | behind |")


def _pair(key: str, arm: str) -> str:
    rec = records.load_records(ROOT / "docs" / "records")[key]
    return records._num("vs_ref", records.summary(rec, records._arm(rec, arm), "vs_ref"))


def test_when_to_use_focus_quotes_the_records():
    """docs/methods.md's FOCUS-against-GRPO numbers and wall-time ratios are the records'."""
    text = (ROOT / "docs" / "methods.md").read_text().split("## When to use FOCUS", 1)[1]
    text = " ".join(text.split("## Adding a tree method", 1)[0].split())
    quoted = {"search": ("methods-search", "focus"), "search-long": ("search-long-200", "focus-0-5"),
              "allocation-early": ("allocation-early", "focus"), "math": ("families-math", "focus"),
              "rules": ("families-rules", "focus"), "locate": ("families-locate", "focus")}
    for env, (key, arm) in quoted.items():
        m = re.search(rf"`{env}` \(([+-]\d+\.\d ± \d+\.\d)", text)
        assert m and m.group(1) == _pair(key, arm), env
    assert f"main command's runs, a later build, give {_pair('search-main', 'focus')}" in text
    recs = records.load_records(ROOT / "docs" / "records")
    main = records.wall_ratio(recs["search-main"], "focus", "grpo")
    early = records.wall_ratio(recs["allocation-early"], "focus", "grpo")
    assert f"takes {main:.2f}x GRPO's wall time" in text and f"`allocation-early` {early:.2f}x" in text


def test_envs_start_and_after_grpo_are_the_records():
    """docs/envs.md's table of each env's start and GRPO's last check: means over the
    records' seeds."""
    recs = records.load_records(ROOT / "docs" / "records")
    text = (ROOT / "docs" / "envs.md").read_text()
    for env, key in (("search", "methods-search"), ("math", "families-math"),
                     ("rules", "families-rules"), ("locate", "families-locate"),
                     ("allocation-early", "allocation-early"), ("allocation-late", "allocation-late")):
        rec = recs[key]
        grpo = records._arm(rec, "grpo")
        start = statistics.mean(grpo["per_seed"]["base"])
        after = start + records.summary(rec, grpo, "final_minus_base")[0] / 100
        row = re.search(rf"^\| `{env}` \| (\d\.\d+) \| (\d\.\d+) \| (\d+) \| `(\w+)` \|$", text, re.M)
        assert row, env
        assert abs(float(row.group(1)) - start) < 0.0015 and abs(float(row.group(2)) - after) < 0.0015, env
        assert (int(row.group(3)), row.group(4)) == (rec["steps"], rec["build"]), env


def _departures() -> dict:
    return json.loads((ROOT / "docs" / "records" / "recipe-departures.json").read_text())


def _departure_mismatches(rec: dict) -> list[str]:
    """Rows whose recipe does not set what the record says, or whose `--set` does not give
    the paper's value."""
    out = []
    for row in rec["rows"]:
        recipe = config.flatten(config.load(method=row["recipe"]))
        sets = [f"{k}={v}" for k, v in row["paper_values"].items()]
        paper = config.flatten(config.load(method=row["recipe"], sets=sets))
        for key, value in row["recipe_values"].items():
            if recipe[key] != value:
                out.append(f"{row['recipe']}: {key} is {recipe[key]!r}, the record says {value!r}")
        for key, value in row["paper_values"].items():
            if paper[key] != value:
                out.append(f"{row['recipe']}: --set {key}={value} gives {paper[key]!r}")
    return out


def test_the_departures_table_is_the_recipes_own():
    rec = _departures()
    assert records.check_record(rec) == [] and _departure_mismatches(rec) == []
    results = (ROOT / "docs" / "results.md").read_text()
    section = results.split("## Recipe departures and their evidence", 1)[1]
    assert section.index("<!-- from docs/records: table:recipe-departures -->") < section.index("| `ppo` |")
    assert "`--set algo.lam=0.95 --set train.critic_warmup=0`" in section
    # a record that misstates a recipe is caught
    rec["rows"][2]["recipe_values"]["algo.lam"] = 0.9
    assert _departure_mismatches(rec) == ["ppo: algo.lam is 1.0, the record says 0.9"]
    del rec["rows"][0]["paper_values"]
    assert records.check_record(rec) == ["row 0: no paper_values"]


def test_results_page_is_short_and_each_verdict_states_its_prediction():
    text = (ROOT / "docs" / "results.md").read_text()
    assert len(text.encode()) < 30_000
    sections = re.split(r"\n(?=#{2,3} )", text)
    with_verdicts = [s for s in sections if "| verdict |" in s]
    assert len(with_verdicts) >= 6       # the families' own tables: docs/results-runs.md
    missing = [s.splitlines()[0] for s in with_verdicts if "**Prediction" not in s]
    assert missing == []


def test_the_verl_adapter_of_coming_from_runs_as_agentrl_calls_it(tmp_path, monkeypatch):
    page = (ROOT / "docs" / "coming-from.md").read_text()
    code = page.split("```python", 1)[1].split("```", 1)[0]
    assert "def verl_score(" in code
    (tmp_path / "my_verl_reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': 1.0 if ground_truth in solution_str else 0.0}\n")
    (tmp_path / "adapter.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_verl_reward", raising=False)
    (fn,) = rewards.load_rewards([{"name": "verl", "fn": f"{tmp_path}/adapter.py:verl_score",
                                   "weight": 1.0}])
    args = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "answer(42)"}],
            "tool_calls": [], "answer": "42", "gold": "42", "reward": 1.0, "success": True,
            "finish": "answer", "task_id": "t-0", "episode": None}
    assert rewards.score(fn, args) == 1.0
    assert rewards.score(fn, {**args, "gold": "7"}) == 0.0
    with pytest.raises(Exception, match="verl"):
        rewards.score(fn, {**args, "messages": None})
