"""Scenario names, which become git ref names and file names, are matched whole: a trailing
newline (`default\n`) passed a `$`-anchored `re.match` and reached the release chain's refs."""

from __future__ import annotations

import pytest

from reef.errors import BadRequest
from reef.releases.chain import UnknownRelease, scenario_of
from reef.scenario import SCENARIO_NAME, check_scenario

NOT_NAMES = ["default\n", "default\r\n", "default\n\n", "\ndefault", " default", "a/b", "a" * 65]


@pytest.mark.parametrize("name", NOT_NAMES)
def test_a_scenario_name_with_anything_around_it_is_refused(name: str) -> None:
    with pytest.raises(BadRequest, match="not a valid scenario name"):
        check_scenario(name)


@pytest.mark.parametrize("name", ["default", "support-2", "A_b", "a" * 64])
def test_plain_scenario_names_are_accepted(name: str) -> None:
    assert check_scenario(name) == name


def test_a_release_ids_scenario_is_matched_whole() -> None:
    assert SCENARIO_NAME.fullmatch("default\n") is None
    with pytest.raises(UnknownRelease):
        scenario_of("default\n@3")
    assert scenario_of("default@3") == "default"
