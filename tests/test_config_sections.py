"""A mistyped config section, in a YAML file or a --set, is one line naming the nearest
section (as a mistyped key names the nearest key), exit code 2."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.errors import ConfigError

runner = CliRunner()
SECTIONS = "sections: algo, context, env, model, rollout, train"


def _one_error_line(args) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    return lines[0]


@pytest.mark.parametrize("yaml_text, needle", [
    ("trian:\n  steps: 3\n", f"unknown config section 'trian' (did you mean 'train'? {SECTIONS})"),
    ("modle:\n  name: tiny\n", "unknown config section 'modle' (did you mean 'model'?"),
    ("bogus:\n  steps: 3\n", f"unknown config section 'bogus' ({SECTIONS})"),
    ("train:\n  stesp: 3\n", "unknown config key 'train.stesp' (did you mean 'train.steps'?)"),
])
def test_a_yaml_section_typo_names_the_nearest_section(tmp_path, yaml_text, needle):
    f = tmp_path / "c.yaml"
    f.write_text(yaml_text)
    assert needle in _one_error_line(["train", "--config", str(f), "--out", str(tmp_path / "r")])


@pytest.mark.parametrize("item, needle", [
    ("trian.foo=3", "unknown config section 'trian' in 'trian.foo' (did you mean 'train'?"),
    ("trian=3", "unknown config section 'trian' (did you mean 'train'?"),
    ("trian.steps=3", "unknown config key 'trian.steps' (did you mean 'train.steps'?)"),
    ("trian.stesp=3", "unknown config key 'trian.stesp' (did you mean 'train.steps'?)"),
    ("evn.nmae=x", "unknown config key 'evn.nmae' (did you mean 'env.name'?)"),
    ("rollot.group_sise=2", "unknown config key 'rollot.group_sise' (did you mean "
                            "'rollout.group_size'?)"),
    ("rollot.sise=2", "unknown config section 'rollot' in 'rollot.sise' (did you mean 'rollout'?"),
])
def test_a_set_section_typo_names_the_nearest_section(tmp_path, item, needle):
    assert needle in _one_error_line(["train", "--set", item, "--out", str(tmp_path / "r")])


def test_far_names_and_valid_sections_are_unchanged():
    with pytest.raises(ConfigError, match=r"^unknown config key 'xyz.a'$"):
        config.load(sets=["xyz.a=1"])
    assert config.load(sets=["train.steps=3"]).train.steps == 3


# ------------------------------------------------------------ values, checked by config itself
@pytest.mark.parametrize("item, needle", [
    ("algo.focus_gain=baye", "algo.focus_gain must be one of plugin, bayes, got 'baye'"),
    ("model.lora_rank=-1", "model.lora_rank must be >= 0 (0: no LoRA), got -1"),
    ("model.lora_dropout=1.0", "model.lora_dropout must be in [0, 1), got 1.0"),
    ("train.log=tensorbord", "train.log: unknown sink 'tensorbord'; valid: tensorboard, wandb"),
])
def test_values_alone_are_checked_when_the_config_is_built(item, needle):
    """Config knows values, not plugins: a value's range or choice fails in `config.load`,
    before `app.preflight.check_names` looks up any plugin."""
    with pytest.raises(ConfigError) as e:
        config.load(sets=[item])
    assert needle in str(e.value)


def test_the_focus_gain_choices_are_the_gains_credit_defines():
    from agentrl_cli.config.validation import _CHOICES
    from agentrl_cli.credit.focus import GAIN_KINDS

    assert _CHOICES["algo.focus_gain"] == GAIN_KINDS


def test_config_imports_nothing_from_reporting():
    """reporting may import config (the sinks' names); config never imports reporting."""
    from test_layers import ROOT, import_edges

    edges = import_edges(ROOT)
    assert {m: sorted(t for t in ts if t.startswith("agentrl_cli.reporting"))
            for m, ts in edges.items() if m.startswith("agentrl_cli.config")} == {
        m: [] for m in edges if m.startswith("agentrl_cli.config")}
    assert "agentrl_cli.config" in edges["agentrl_cli.reporting.sinks"]
