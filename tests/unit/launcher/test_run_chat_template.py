"""`meshfront run --chat-template FILE`: checked before anything starts, given to the preprocessor in both shapes."""

from __future__ import annotations

import pytest

from services.allinone.config import parse_config as allinone_config
from services.launcher.plan import MeshPlan, WorkerSpec, specs
from services.launcher.run import STAGES, parse_args

pytestmark = pytest.mark.unit

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def plan_for(args, tmp_path) -> MeshPlan:
    return MeshPlan(inproc=args.inproc, run_dir=tmp_path, workers=[WorkerSpec(str(tmp_path), "demo")],
                    worker_ports=[9500], service_args={s: tuple(getattr(args, f"{s}_flag")) for s in STAGES})


@pytest.mark.parametrize("inproc", [False, True])
def test_the_template_reaches_the_preprocessor_in_both_shapes(tmp_path, inproc):
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    args = parse_args(["--chat-template", str(template), "--preprocessor-flag=--offload-threshold=3",
                       *(["--inproc"] if inproc else [])])
    stage = "gateway-0" if inproc else "preprocessor"
    argv = next(s.argv for s in specs(plan_for(args, tmp_path)) if s.name == stage)
    i = argv.index("--chat-template")
    assert argv[i + 1] == str(template.resolve()) and "--offload-threshold=3" in argv
    if inproc:  # the all-in-one process takes the flag as its preprocessor's
        cfg = allinone_config(argv[argv.index("-m") + 2:], {})
        assert cfg.preprocessor.chat_template == TEMPLATE


def test_a_template_that_does_not_compile_fails_before_anything_starts(tmp_path, capsys):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ messages[0].content ")
    with pytest.raises(SystemExit) as e:
        parse_args(["--chat-template", str(bad)])
    assert e.value.code == 2
    assert f"--chat-template {bad} does not compile" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--chat-template", str(tmp_path / "missing.jinja")])
