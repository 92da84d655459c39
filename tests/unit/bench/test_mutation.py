"""bench.mutation, the kill-rate table of `make mutate`, read from a captured
`mutmut results --all true` (mutmut 3.8)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench.mutation import main, module_of, rate, tally

CAPTURED = """\
    serving.inputs.x_codec__mutmut_1: killed
    serving.inputs.x_codec__mutmut_2: survived
    serving.inputs.image.xǁImageCodecǁ_pixels__mutmut_7: timeout
    serving.inputs.image.xǁImageCodecǁ_pixels__mutmut_8: no tests
    edge.audit.x_wilson__mutmut_1: killed
    edge.audit.x_wilson__mutmut_2: killed
    edge.audit.xǁAuditorǁpick__mutmut_3: survived
    edge.audit.xǁAuditorǁpick__mutmut_4: not checked
"""


def test_mutants_are_counted_by_status_under_their_module() -> None:
    counts = tally(["some banner line", *CAPTURED.splitlines(), ""])
    assert counts == {
        "serving.inputs": Counter({"killed": 1, "survived": 1}),
        "serving.inputs.image": Counter({"timeout": 1, "no tests": 1}),
        "edge.audit": Counter({"killed": 2, "survived": 1, "not checked": 1}),
    }


def test_a_method_and_a_function_name_their_module() -> None:
    assert module_of("registry.releases.waves.xǁWavesǁgate__mutmut_12") == \
        "registry.releases.waves"
    assert module_of("edge.cache.x_key__mutmut_1") == "edge.cache"
    with pytest.raises(ValueError, match="not a mutmut mutant name"):
        module_of("edge.cache.key")


def test_timeouts_count_as_killed_and_mutants_not_run_yet_count_for_nothing() -> None:
    assert rate(Counter({"killed": 3, "timeout": 1, "survived": 1, "no tests": 1})) == 4 / 6
    assert rate(Counter({"killed": 2, "survived": 1, "not checked": 5})) == 2 / 3
    assert rate(Counter({"not checked": 5})) == 0.0


def test_the_table_has_a_row_per_module_and_the_overall_rate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "results.txt"
    saved.write_text(CAPTURED)
    main(["--results", str(saved)])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == ("| module | mutants run | killed | timeout | survived | no tests "
                        "| kill rate |")
    assert lines[2:6] == ["| edge.audit | 3 | 2 | 0 | 1 | 0 | 66.7% |",
                          "| serving.inputs | 2 | 1 | 0 | 1 | 0 | 50.0% |",
                          "| serving.inputs.image | 2 | 0 | 1 | 0 | 1 | 50.0% |",
                          "| all | 7 | 3 | 1 | 2 | 1 | 57.1% |"]
    assert "1 not run yet" in out
    saved.write_text("    edge.cache.x_key__mutmut_1: not checked\n")
    main(["--results", str(saved)])
    assert "| edge.cache | 0 | 0 | 0 | 0 | 0 | not run |" in capsys.readouterr().out


def test_no_results_is_an_error_that_says_what_to_run(tmp_path: Path) -> None:
    saved = tmp_path / "results.txt"
    saved.write_text("")
    with pytest.raises(SystemExit, match="run `make mutate`"):
        main(["--results", str(saved)])
