"""The README stays true: its commands, and a configuration reference that matches the code."""

from __future__ import annotations

from pathlib import Path

from stack.reference import END, START, readme_with_reference

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_starts_with_the_two_setup_commands():
    block = README.split("```sh\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    assert block[0].endswith("python -m stack --demo")
    assert block[1].endswith("python -m pytest")


def test_ci_runs_the_readme_test_command():
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    test_command = README.split("```sh\n", 1)[1].splitlines()[1]
    assert test_command in ci.splitlines()


def test_configuration_reference_matches_the_settings_classes():
    assert START in README and END in README
    assert readme_with_reference(README) == README, "run: python -m stack.reference --write"
