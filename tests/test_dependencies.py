"""effdepth's own calls into transformers and torch raise no warning (deprecations included), on every
architecture: a dependency release that deprecates something effdepth uses fails here, by name, rather
than printing a stranger's warning in every user's run (transformers 5.24 renamed ``past_key_values``)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import ARCHS, make_tiny, random_prompts

from effdepth_core.errors import EffdepthWarning
from effdepth_core.measurement.probes import (
    early_exit,
    erasure_map,
    integrated_gradients,
    layer_pruning,
    logit_lens,
    residual_cosine,
    skip_effects,
)
from effdepth_core.measurement.replay import cache_keyword, clean_run, run_suffix_layer


def _answered(loaded) -> list[tuple[torch.Tensor, int]]:
    return [(ids, 3) for ids in random_prompts([16, 21])]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_effdepths_calls_raise_no_dependency_warning(arch):
    loaded = make_tiny(arch)
    prompts = random_prompts([16, 21])
    answered = _answered(loaded)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = clean_run(loaded, prompts[0])
        with torch.no_grad():
            if run.reuses_prefixes:  # not BLOOM's (ALiBi): it replays whole prompts
                run_suffix_layer(loaded, run, 0, run.hidden[0][:, 5:], 5)
        residual_cosine(loaded, prompts)
        logit_lens(loaded, prompts)
        skip_effects(loaded, prompts, skip_positions=1, skip_parts=["layer"])
        erasure_map(loaded, answered[:1])
        integrated_gradients(loaded, answered[:1], igrad_steps=8, igrad_quadrature="gauss", layers=[1])
        early_exit(loaded, answered[:1])
        layer_pruning(loaded, answered[:1], prune_sizes=[1])
    others = [w for w in caught if not issubclass(w.category, EffdepthWarning)]
    assert not others, [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in others]


def test_the_cache_keyword_follows_the_installed_transformers():
    import inspect

    loaded = make_tiny("llama")
    base = loaded.base_model()
    expected = "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
    assert cache_keyword(base) == expected


def test_a_newer_torch_is_never_asked_to_downgrade():
    """The torch requirement has a floor (the lowest tested) and no cap: a user's torch 2.14 or 2.15
    satisfies it, so installing effdepth beside it changes nothing (the cap was CI's limit)."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's; CI runs 3.11")

    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    (torch_req,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch"]
    assert all(torch_req.specifier.contains(v) for v in ("2.13.0", "2.14.0", "2.15.1", "3.0.0"))
    assert not torch_req.specifier.contains("2.12.1")  # the floor stays the lowest tested


def test_requires_python_is_what_the_lock_can_install():
    """pyproject.toml claimed Python >= 3.10, but the locked numpy, pandas, polars, transformers and
    ipython need >= 3.11: README's set-up command could not resolve on 3.10. The floor is now the
    lowest Python every locked package's own ``Requires-Python`` admits, read from the installed
    distributions where they are the locked versions (README's set-up venv)."""
    from importlib import metadata
    from pathlib import Path

    from packaging.specifiers import SpecifierSet

    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's; CI runs 3.11")
    root = Path(__file__).resolve().parents[1]
    claimed = SpecifierSet(tomllib.loads((root / "pyproject.toml").read_text())["project"]["requires-python"])
    floors = {}
    for line in (root / "constraints" / "locked.txt").read_text().splitlines():
        if "==" not in line or line.startswith("#"):
            continue
        name, version = line.strip().split("==")
        try:
            installed = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if installed.version.split("+")[0] != version:  # the newest or lowest versions' run: not the lock
            continue
        admits = SpecifierSet(installed.metadata.get("Requires-Python") or "")
        floors[name] = next(m for m in range(6, 20) if admits.contains(f"3.{m}.0") or admits.contains(f"3.{m}.99"))
    if len(floors) < 50:
        pytest.skip("the locked versions are not the installed ones (the newest or lowest versions' run)")
    lowest = max(floors.values())
    assert lowest == 11, sorted(floors.items(), key=lambda item: -item[1])[:5]  # README names 3.11
    assert claimed.contains(f"3.{lowest}.0") and not claimed.contains(f"3.{lowest - 1}.99"), claimed
    readme = (root / "README.md").read_text()
    assert f"Python 3.{lowest}" in readme and f"Python 3.{lowest - 1}" not in readme
