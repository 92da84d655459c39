"""The names the catalog takes (``registry.releases.names``): a model name is checked before
anything is read or stored under it, and a refusal says which name and what a valid one is.
The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import pytest

from registry.errors import InvalidName, NotFound
from registry.releases.catalog import Catalog
from tests.unit.registry.test_rollout import catalog, manifest

__all__ = ["catalog"]  # the fixture, imported


@pytest.mark.parametrize("name", ["../m", "M", "-m", "m/1", "m" * 129])
def test_an_invalid_model_name_is_refused_with_the_rule_it_breaks(catalog: Catalog,
                                                                   name: str) -> None:
    with pytest.raises(InvalidName) as refused:
        catalog.versions(name)
    assert str(refused.value) == (
        f"invalid model name {name!r}: use lowercase ASCII letters, digits, '.', '_' and '-', "
        f"starting with a letter or digit, at most 128 characters (no '..', no '/')")


def test_a_valid_name_is_looked_up_not_refused(catalog: Catalog) -> None:
    catalog.create_version(manifest("m" * 128))
    assert [v.version for v in catalog.versions("m" * 128)] == [1]
    with pytest.raises(NotFound, match=r"no model named 'a\.b_c-1' in the registry"):
        catalog.versions("a.b_c-1")
