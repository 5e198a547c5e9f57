"""A model refused by the layout check is refused for the cause the caller can fix: their own hook
(once blamed on "a residual multiplier"), or a config whose layer count disagrees with the layers."""

from __future__ import annotations

import pytest
from conftest import make_tiny

from effdepth_core.errors import UnsupportedModelError
from effdepth_core.models import wrap_model


def test_a_steering_hook_that_breaks_the_layout_is_named():
    model = make_tiny("llama").model

    def steer(module, args, out):  # a steering vector added to the residual after layer 1
        return (out[0] + 1.0, *out[1:]) if isinstance(out, tuple) else out + 1.0

    handle = model.model.layers[1].register_forward_hook(steer)
    with pytest.raises(UnsupportedModelError, match=r"has a hook on model\.layers\.1 .*remove it") as refused:
        wrap_model(model)
    assert "residual multiplier" not in str(refused.value) and "\n" not in str(refused.value)
    handle.remove()
    wrap_model(model)  # the clean model is measured


def test_a_config_at_odds_with_the_layers_is_named():
    model = make_tiny("llama").model
    held = len(model.model.layers)
    model.config.num_hidden_layers = held - 1  # the stack now runs one layer less than it holds
    with pytest.raises(UnsupportedModelError, match=f"config says {held - 1} layers .* holds {held}"):
        wrap_model(model)


def test_a_symlinked_reuse_from_is_followed_as_table_follows_it(tmp_path):
    """A ``--reuse-from`` the user named that is a link was skipped silently while ``effdepth table``
    followed the same link: it is followed (read only) like any folder the user names."""
    from effdepth_core.results import _candidates
    from effdepth_core.settings import RunSettings

    run = tmp_path / "runs" / "addition-n2"
    run.mkdir(parents=True)
    (run / "metadata.json").write_text("{}")
    (tmp_path / "link").symlink_to(run)
    (tmp_path / "folder-link").symlink_to(tmp_path / "runs")
    settings = RunSettings("tiny", "addition", n=2)
    out = tmp_path / "out"
    assert _candidates(out, settings, [tmp_path / "link"], derived=False) == [run]
    assert _candidates(out, settings, [tmp_path / "folder-link"], derived=False) == [run]


def test_a_hook_replaced_under_its_id_is_checked_again():
    """The checked-once verdict (load-time checks skipped for a model seen unchanged) is reused only
    while the model computes what it computed when checked: a hook's function replaced under the same
    hook id once left a model measured that a fresh process refuses."""
    model = make_tiny("llama").model
    layer = model.model.layers[1]
    handle = layer.register_forward_hook(lambda module, args, out: None)  # harmless: the checks pass
    wrap_model(model)

    def steer(module, args, out):
        return (out[0] + 1.0, *out[1:]) if isinstance(out, tuple) else out + 1.0

    layer._forward_hooks[handle.id] = steer  # the same id, another function
    with pytest.raises(UnsupportedModelError, match=r"has a hook on model\.layers\.1"):
        wrap_model(model)
