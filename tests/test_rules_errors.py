"""benchmarks/rules_errors.py sorts a failed `rules` answer by kind; an itemised fee counts
the same as the counted one."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("rules_errors", ROOT / "benchmarks" / "rules_errors.py")
re_ = importlib.util.module_from_spec(spec)
spec.loader.exec_module(re_)

META = {"numeric": True, "terms": [["bag", "bag1", 30], ["bag", "bag2*2", 80], ["weight", "heavy", 100]]}


def episode(*actions, success=False, obs=""):
    return {"success": success, "question": "Case: bags: 24, 18, 12 kg.",
            "turns": [{"action": a, "observation": obs} for a in actions]}


def test_classify_by_kind():
    c = re_.classify
    assert c(episode("calc(bag1+heavy+bag2+bag2)", "answer(210)", success=True), META) == "numeric right"
    # the itemised and the counted fee name the same amounts as often: not a rule-choice error
    same = c(episode("calc(bag1+heavy+bag2+bag2)", "answer(211)", obs="30 80 100"), META)
    assert same.startswith("numeric: the same named amounts")
    assert c(episode("calc(bag1+bag2*2)", "answer(110)"), META).startswith("numeric: other rules")
    assert c(episode("calc(bag1+heavy+bag2)", "answer(170)"), META).startswith("numeric: other rules")
    assert c(episode("answer(210)"), META) == "numeric: answered without calc, the fee has several terms"
    assert c(episode("calc(bag1)"), META) == "numeric: no answer (turns ran out or malformed)"
    assert c(episode("answer(no)"), {"numeric": False}) == "yes/no wrong"
