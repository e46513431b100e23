"""`agentrl view`'s report in a real browser: headless Chromium driven by Selenium opens the
page of a short FOCUS run from disk and checks what a user sees (a tree with the trace's node
count, a click that shows a node's text, every trained token marked, the curves and the critic,
no request to any server), then saves a screenshot (docs/figures/view-report.png with
AGENTRL_SAVE_SCREENSHOT=1).

Needs Chromium and its driver (`apt-get install chromium chromium-driver`) and selenium (the
`test` extra). Without them the test fails with the install line; it skips only where
AGENTRL_NO_BROWSER=1 says there is no browser on purpose."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.reporting.traces import read_trace, trace_steps
from agentrl_cli.app.train import train

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["rollout.tasks_per_step=2", "rollout.group_size=4", "train.eval_tasks=3",
         "train.eval_samples=1", "train.eval_every=1", "train.save_every=0", "train.trace_every=1",
         "train.steps=2"]


def _browser():
    if os.environ.get("AGENTRL_NO_BROWSER") == "1":
        pytest.skip("AGENTRL_NO_BROWSER=1: no browser on purpose")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: pip install -e '.[test]'")
    chrome = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                   if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    if chrome is None or driver is None:
        pytest.fail("headless Chromium is missing: apt-get install chromium chromium-driver "
                    "(AGENTRL_NO_BROWSER=1 skips this test)")
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,3200", "--hide-scrollbars"):
        opts.add_argument(a)
    opts.binary_location = chrome
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """(run folder, report file) of a 2-step FOCUS run of the shipped agent, every step traced."""
    out = tmp_path_factory.mktemp("browser") / "run"
    train(config.load(sets=SHORT, method="focus"), out, log=lambda s: None)
    r = CliRunner().invoke(app, ["view", str(out)])
    assert r.exit_code == 0, r.output
    return out, out / "report.html"


@pytest.fixture(scope="module")
def browser():
    d = _browser()
    yield d
    d.quit()


def _open(browser, page: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(page.resolve().as_uri())
    WebDriverWait(browser, 20).until(
        lambda d: d.execute_script("return document.body.getAttribute('data-ready')") == "1")


def _errors(browser) -> list:
    return [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]


def _select(browser, id_: str, value) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, id_)).select_by_value(str(value))


def test_the_report_in_a_browser(report, browser, tmp_path):
    from selenium.webdriver.common.by import By

    run, page = report
    _open(browser, page)
    assert _errors(browser) == []
    # nothing fetched: no scripts, styles or images from anywhere
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert browser.find_elements(By.CSS_SELECTOR, "script[src], link[href], img[src]") == []
    last = max(trace_steps(run))
    trace = read_trace(trace_steps(run)[last])
    k = max(range(len(trace["trees"])), key=lambda i: len(trace["trees"][i]["nodes"]))
    tree = trace["trees"][k]
    _select(browser, "tree-select", k)
    nodes = browser.find_elements(By.CSS_SELECTOR, "#tree-svg .node")
    assert len(nodes) == len(tree["nodes"]) > 1
    pick = next(nd for nd in tree["nodes"] if nd["depth"] >= 1 and nd["action"])
    browser.find_element(By.CSS_SELECTOR, f'#tree-svg .node[data-id="{pick["id"]}"]').click()
    head = browser.find_element(By.CSS_SELECTOR, "#node-detail h3").text
    assert head.startswith(f"node {pick['id']} ")
    shown = browser.execute_script(
        "return document.querySelector('#node-state .state-action').textContent")
    assert shown == pick["action"]
    browser.find_element(By.CSS_SELECTOR, 'input[name="colour"][value="vtilde"]').click()
    assert browser.find_element(By.CSS_SELECTOR, "#tree-svg .node.selected").get_attribute(
        "data-id") == str(pick["id"])
    _check_episodes(browser, trace)
    _check_curves_and_critic(browser)
    assert _errors(browser) == []
    _screenshot(browser, trace, tmp_path)


def _check_episodes(browser, trace) -> None:
    """Every traced episode: one element per token, the trained ones (response mask) marked,
    each with its advantage on hover."""
    from selenium.webdriver.common.by import By

    for i, ep in enumerate(trace["episodes"]):
        _select(browser, "episode-select", i)
        toks = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok")
        trained = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok.trained")
        assert len(toks) == len(ep["tokens"])
        assert len(trained) == sum(ep["response_mask"]) == ep["trained_tokens"] > 0
    title = trained[0].get_attribute("title")
    j = ep["response_mask"].index(1)
    assert title == f"trained · advantage {ep['advantages'][j]:+.4f}"


def _check_curves_and_critic(browser) -> None:
    from selenium.webdriver.common.by import By

    assert browser.find_elements(By.ID, "chart-eval_success")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-eval_success polygon")  # the ± se band
    assert not browser.find_elements(By.ID, "chart-loss_policy")
    browser.find_element(By.CSS_SELECTOR, '#metric-picker input[value="loss/policy"]').click()
    assert browser.find_elements(By.ID, "chart-loss_policy")
    assert browser.find_elements(By.CSS_SELECTOR, "#calibration circle")
    assert browser.find_elements(By.CSS_SELECTOR, "#tool-calls polyline")
    assert browser.find_elements(By.CSS_SELECTOR, "#budget-tree rect.bar")


def _screenshot(browser, trace, tmp_path: Path) -> None:
    """The trees-and-episodes part of the page, as a user sees it (a successful episode)."""
    from selenium.webdriver.common.by import By

    _select(browser, "episode-select", next((i for i, e in enumerate(trace["episodes"]) if e["success"]), 0))
    target = (ROOT / "docs" / "figures" / "view-report.png"
              if os.environ.get("AGENTRL_SAVE_SCREENSHOT") == "1" else tmp_path / "view-report.png")
    browser.find_element(By.ID, "traces").screenshot(str(target))
    assert target.stat().st_size > 10_000


def test_a_sweep_report_in_a_browser(report, browser, tmp_path):
    from selenium.webdriver.common.by import By

    run, _ = report
    cells = []
    for name, beta in (("focus-beta=0", "0"), ("focus-beta=1", "1")):
        for seed in (0, 1):
            d = tmp_path / "sweep" / "cells" / name / f"seed-{seed}"
            d.mkdir(parents=True)
            for f in ("config.json", "metrics.jsonl", "summary.json"):
                shutil.copy(run / f, d / f)
        cells.append({"name": name, "method": "focus", "params": {"algo.beta": beta}})
    (tmp_path / "sweep" / "ablation.json").write_text(json.dumps({"seeds": [0, 1], "cells": cells}))
    r = CliRunner().invoke(app, ["view", str(tmp_path / "sweep")])
    assert r.exit_code == 0, r.output
    _open(browser, tmp_path / "sweep" / "report.html")
    assert _errors(browser) == []
    assert len(browser.find_elements(By.CSS_SELECTOR, "#sweep-curves polyline")) >= 4   # 4 runs
    assert browser.find_elements(By.CSS_SELECTOR, "#final-vs-algo_beta circle")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#cells tr")) == 1 + 4


def test_a_bad_part_does_not_blank_the_page(report, browser, tmp_path):
    """What could not be read is listed on the page; a part that fails to draw (a trace or
    metrics that got past the checks, put on the page here directly) shows a note in its
    place and every other part is drawn."""
    from selenium.webdriver.common.by import By

    from agentrl_cli.reporting import view as view_mod

    run, _ = report
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints", "report.html"))
    (copy / "summary.json").unlink()
    (copy / "summary.json").symlink_to(run / "summary.json")
    r = CliRunner().invoke(app, ["view", str(copy)])
    assert r.exit_code == 0 and "could not read" in r.output, r.output
    _open(browser, copy / "report.html")
    rows = browser.find_elements(By.CSS_SELECTOR, "#problems-table tr")
    assert len(rows) == 2 and "summary.json" in rows[1].text and "symbolic link" in rows[1].text
    assert browser.find_elements(By.CSS_SELECTOR, "#tree-svg .node") and _errors(browser) == []

    data = view_mod.run_data(run)
    data["traces"][-1]["trees"][0]["nodes"] = "not a list"
    (tmp_path / "tree.html").write_text(view_mod.page(data), encoding="utf-8")
    _open(browser, tmp_path / "tree.html")
    assert "could not be drawn" in browser.find_element(By.ID, "tree-view").text
    assert browser.find_elements(By.CSS_SELECTOR, "#tokens .tok.trained")
    assert browser.find_elements(By.ID, "chart-eval_success")
    assert browser.find_elements(By.CSS_SELECTOR, "#calibration circle")

    data = view_mod.run_data(run)
    data["metrics"] = "not rows"
    (tmp_path / "curves.html").write_text(view_mod.page(data), encoding="utf-8")
    _open(browser, tmp_path / "curves.html")
    assert "could not be drawn" in browser.find_element(By.ID, "curves").text
    assert browser.find_elements(By.CSS_SELECTOR, "#tree-svg .node")
    assert browser.find_elements(By.CSS_SELECTOR, "#tokens .tok")
