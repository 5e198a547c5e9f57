"""The model-first Python API: a model in memory or by name, a list of prompts or a task; results
that are the probes' own numbers, cached by what was measured (never in the working directory),
the caller's model left as it was, charts that draw offline in a notebook."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from conftest import char_tokenizer, make_tiny

from effdepth_core import measure
from effdepth_core.errors import EffdepthError, UnsupportedModelError
from effdepth_core.measurement.probes import logit_lens, residual_cosine

PROMPTS = ["the capital of france is", "two plus two is four"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # a notebook's folder: nothing may land here
    return tmp_path


def test_measure_a_model_in_memory_on_a_list_of_prompts(cache):
    model, tokenizer = make_tiny("llama").model, char_tokenizer()
    model.train().requires_grad_(True)  # the caller's state, restored afterwards
    result = measure(model, PROMPTS, tokenizer=tokenizer, progress=False)
    assert model.training and all(p.requires_grad for p in model.parameters())
    loaded = make_tiny("llama")  # the same weights, wrapped by hand: the probes called directly
    loaded.tokenizer = tokenizer
    assert result.per_example["cosine"].equals(residual_cosine(loaded, PROMPTS))
    assert result.per_example["logit_lens"].equals(logit_lens(loaded, PROMPTS, head_dtype="auto"))  # measure's default
    assert set(result.depth) >= {"cosine", "logit_lens_kl", "logit_lens_overlap"}
    # a model in memory takes the shortest road: probes on the model, no run kept (only the prompts'
    # content-named task file is written)
    assert result.out_dir is None and not (cache / "cache" / "runs").exists() and not (cache / "results").exists()
    kept = measure(model, PROMPTS, tokenizer=tokenizer, progress=False, cache=True)  # asked to keep it
    assert str(kept.out_dir).startswith(str(cache / "cache")) and kept.summary == result.summary
    for name, frame in result.per_example.items():
        assert kept.per_example[name].equals(frame), name  # the two roads give the same numbers
    again = measure(model, PROMPTS, tokenizer=tokenizer, progress=False, cache=True)  # read back, not recomputed
    assert again.out_dir == kept.out_dir and again.per_example["cosine"].equals(result.per_example["cosine"])
    assert again.metadata["probes"]["cosine"]["seconds"] == kept.metadata["probes"]["cosine"]["seconds"]
    other = measure(model, PROMPTS[:1], tokenizer=tokenizer, progress=False, cache=True)  # other text: another entry
    assert other.out_dir != kept.out_dir
    assert "<table>" in result._repr_html_() and "memory only" in repr(result)
    with pytest.raises(EffdepthError, match="cache=False keeps none"):
        measure(model, PROMPTS, tokenizer=tokenizer, out=cache / "x", cache=False)


def test_measure_refuses_what_it_cannot_key_in_one_line(cache):
    model = make_tiny("llama").model
    with pytest.raises(EffdepthError, match="pass tokenizer="):
        measure(model, PROMPTS, progress=False)
    with pytest.raises(EffdepthError, match="for token ids call the probe functions directly"):
        measure(model, [torch.tensor([3, 4, 5])], tokenizer=char_tokenizer(), progress=False)
    with pytest.raises(EffdepthError, match="model must be a name, a LoadedModel or a transformers model"):
        measure(42, PROMPTS, progress=False)
    for empty in ("", ["abc", " "]):  # text, but none to run: said as such (it once blamed the type)
        with pytest.raises(EffdepthError, match="is empty: measure needs text"):
            measure(model, empty, tokenizer=char_tokenizer(), progress=False)


def test_a_model_in_memory_is_keyed_by_its_content_not_its_label(cache):
    """name= labels the result; the key is the model's content, so a relabelled model reuses the
    rows (nothing computed) and shows its new label, while another model under the same label does not."""
    model, tokenizer = make_tiny("llama").model, char_tokenizer()
    first = measure(model, PROMPTS, tokenizer=tokenizer, name="mine", progress=False, cache=True)
    again = measure(model, PROMPTS, tokenizer=tokenizer, name="the same, renamed", progress=False, cache=True)
    assert again.model_label == "the same, renamed" and again.metadata["key"] == first.metadata["key"]
    assert again.metadata["probes"]["cosine"]["reused"]["examples"] == len(PROMPTS)  # rows reused, none computed
    assert again.per_example["cosine"].equals(first.per_example["cosine"])
    other = measure(
        make_tiny("llama", seed=7).model, PROMPTS, tokenizer=tokenizer, name="mine", progress=False, cache=True
    )
    assert other.metadata["key"] != first.metadata["key"] and "reused" not in other.metadata["probes"]["cosine"]


def test_a_model_loaded_by_name_is_keyed_by_its_name_only_while_it_is_what_the_name_loads(cache, tiny_dir):
    """A hostile pass found the name key reused for a bfloat16 load of a float32-measured model and
    for a model whose weights were edited in place: both returned the earlier numbers. The name keys
    a run only while the model is what ``load_model(name)`` gives in the run's dtype, untouched."""
    from effdepth_core.models import load_model
    from effdepth_core.results import RunSettings, run

    spec = str(tiny_dir)
    plain = load_model(spec, device="cpu", dtype="float32", progress=False)
    first = measure(plain, PROMPTS, progress=False, cache=True)
    assert (
        first.out_dir
        == measure(load_model(spec, device="cpu", progress=False), PROMPTS, progress=False, cache=True).out_dir
    )
    half = load_model(spec, device="cpu", dtype="bfloat16", progress=False)
    in_bf16 = measure(half, PROMPTS, progress=False, cache=True)
    assert in_bf16.out_dir != first.out_dir and in_bf16.metadata["settings"]["dtype"] == "bfloat16"
    assert in_bf16.per_example["cosine"].equals(residual_cosine(half, PROMPTS))
    with torch.no_grad():  # an edit in place: another model under the same name
        plain.layers[1].mlp.down_proj.weight.mul_(3.0)
    edited = measure(plain, PROMPTS, progress=False, cache=True)
    assert edited.out_dir != first.out_dir
    assert edited.per_example["cosine"].equals(residual_cosine(plain, PROMPTS))
    assert not edited.per_example["cosine"].equals(first.per_example["cosine"])
    eager = load_model(spec, device="cpu", dtype="float32", progress=False, attn_implementation="eager")
    assert (
        measure(eager, PROMPTS, progress=False, cache=True).out_dir != first.out_dir
    )  # another load: keyed by weights
    with pytest.raises(EffdepthError, match="the model given is bfloat16 but the settings ask for float32"):
        run(RunSettings(spec, "gsm8k", n=2, progress=False), "cosine", loaded=half)


def test_load_model_takes_a_tokenizer_and_transformers_arguments(tmp_path, tiny_dir):
    import shutil

    from effdepth_core.errors import ModelNotFoundError
    from effdepth_core.models import load_model

    bare = tmp_path / "no-tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (tiny_dir / name).is_file():
            shutil.copy(tiny_dir / name, bare / name)
    with pytest.raises(ModelNotFoundError, match=r"cannot load a tokenizer .* pass tokenizer="):
        load_model(str(bare), device="cpu", dtype="float32", progress=False)
    loaded = load_model(str(bare), device="cpu", dtype="float32", progress=False, tokenizer=str(tiny_dir))
    assert loaded.encode("abc").tolist() == char_tokenizer()("abc")["input_ids"]
    eager = load_model(str(tiny_dir), device="cpu", dtype="float32", progress=False, attn_implementation="eager")
    assert eager.model.config._attn_implementation == "eager"


def test_a_notebook_that_imports_effdepth_measures_and_draws_offline(tmp_path, tiny_dir, monkeypatch):
    """A notebook with only effdepth and transformers: load a model, measure a list of prompts,
    show a chart as the cell's last expression — executed, its output drawable without a network
    (the static SVG beside the Vega-Lite spec)."""
    nbformat = pytest.importorskip("nbformat", reason="the [book] extra runs notebooks")
    nbclient = pytest.importorskip("nbclient", reason="the [book] extra runs notebooks")
    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cells = [
        "from transformers import AutoModelForCausalLM, AutoTokenizer\nimport effdepth_core",
        f"model = AutoModelForCausalLM.from_pretrained({str(tiny_dir)!r})\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(tiny_dir)!r})",
        f"result = effdepth_core.measure(model, {PROMPTS!r}, tokenizer=tokenizer)\nresult",
        "result.plot()",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(tmp_path)}}).execute()
    table, chart = notebook.cells[2].outputs[-1]["data"], notebook.cells[3].outputs[-1]["data"]
    assert "text/html" in table and "cosine" in table["text/html"]
    assert "image/svg+xml" in chart  # drawn without Vega from a CDN
    assert not (tmp_path / "results").exists()


def test_run_from_python_keeps_its_results_in_the_cache_not_the_working_directory(cache):
    from effdepth_core import RunSettings, run

    loaded = make_tiny("llama")
    loaded.tokenizer = char_tokenizer()
    result = run(RunSettings("tiny", "addition", n=2, digits=2, progress=False), ["cosine"], loaded=loaded)
    assert result.out_dir.is_relative_to(cache / "cache" / "runs"), result.out_dir
    assert not (cache / "results").exists()


def test_effective_depth_knows_every_registered_rule_and_gives_a_frame():
    """The norm probe's rule (not a correlational one) and a rule option, through the shortcut, equal
    the rule applied by hand; the result reads as a frame."""
    from conftest import random_prompts

    from effdepth_core import effective_depth
    from effdepth_core.measurement.depth import depth_table
    from effdepth_core.measurement.probes.norm import ed_norm, residual_norm
    from effdepth_core.measurement.probes.shared.reduce import token_weighted_mean

    loaded = make_tiny("llama")
    norm = residual_norm(loaded, random_prompts([9, 12, 7]))
    found = effective_depth(None, None, loaded.n_layers, frames={"norm": norm}, norm_fraction=0.2, n_bootstrap=50)
    curve = token_weighted_mean(norm).sort("layer")["value"].to_numpy()
    assert found["residual_norm"].ed == ed_norm(curve, 0.2)
    table = depth_table(found)
    assert table["rule"].to_list() == ["residual_norm"] and table["ed"][0] == found["residual_norm"].ed
    with pytest.raises(EffdepthError, match="unknown option\\(s\\) nrm_fraction for effective_depth"):
        effective_depth(None, None, loaded.n_layers, frames={"norm": norm}, nrm_fraction=0.2)  # misspelt: refused


def test_lens_curves_mark_the_eds_effective_depth_gives():
    """The ED rows of effective_depth (rule keys, no model or task) mark the lens chart as the
    book's labelled summary does."""
    from conftest import random_prompts

    from effdepth_book import plots
    from effdepth_core import effective_depth
    from effdepth_core.measurement.depth import depth_table

    loaded = make_tiny("llama")
    lens = logit_lens(loaded, random_prompts([9, 12]))
    eds = depth_table(effective_depth(None, lens, loaded.n_layers, n_bootstrap=20))
    with plots.alt.data_transformers.enable("default", max_rows=None):
        spec = plots.lens_curves(lens, eds, model="tiny", task="mine").to_dict()
    marked = [d for d in spec.get("datasets", {}).values() if d and "ed" in d[0]]
    expected = sorted({int(e) for e in eds["ed"].drop_nulls()})
    assert sorted(int(row["ed"]) for rows in marked for row in rows) == expected
    # the KL rule's line: half the largest mean KL over layers, from the per-example rows by hand
    per_layer: dict[int, list[tuple[float, int]]] = {}
    for row in lens.filter(metric="kl").iter_rows(named=True):
        per_layer.setdefault(row["layer"], []).append((row["value"], row["n_tokens"]))
    means = [sum(v * n for v, n in rows) / sum(n for _, n in rows) for rows in per_layer.values()]
    (cut,) = [row["cut"] for d in spec["datasets"].values() if d and "cut" in d[0] for row in d]
    assert cut == pytest.approx(0.5 * max(means), abs=1e-4)  # the chart rounds to 4 decimals


def test_the_api_reference_page_gives_every_public_name_with_its_signature_and_docstring():
    import inspect

    import effdepth_core
    from effdepth_book.api_reference import api_markdown

    page = api_markdown()
    unescaped = page.replace("\\", "")  # Markdown's escapes taken back out
    for name in effdepth_core.__all__:
        obj = getattr(effdepth_core, name)
        assert f"### `{name}`" in page, name
        first = (inspect.getdoc(obj) or "").splitlines()[0]
        assert first in unescaped, name  # its docstring's first line, as written
    signature = page.split("### `measure`")[1].split("```")[1]
    for parameter in inspect.signature(effdepth_core.measure).parameters:
        assert parameter in signature  # every parameter, by name
    assert "<factory>" not in page.split("```python")[0]  # escaped markup never leaks outside code


def test_measure_refuses_a_mapping_or_a_data_frame_and_rechecks_its_prompts_file(tmp_path, monkeypatch):
    """Iterating a dict gives its keys and a pandas frame its column names: both are refused in one
    line (never measured as the prompts); the prompts file named by its content is checked against
    that content on every call, so editing it cannot change what a later call measures."""
    import polars as pl

    from effdepth_core.api import _prompts_task
    from effdepth_core.errors import EffdepthError

    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    for given in ({"prompt": "a cat"}, pl.DataFrame({"prompt": ["a cat"]}), {"a cat"}):
        with pytest.raises(EffdepthError, match="measure takes a task name, one prompt or a list of prompts"):
            _prompts_task(given)
    path, n, _ = _prompts_task(["a cat"])
    assert n == 1 and '"a cat"' in open(path).read()
    with open(path, "w") as handle:
        handle.write('{"prompt": "a dog"}\n')  # the file edited behind effdepth's back
    again, _, _ = _prompts_task(["a cat"])
    assert again == path and '"a cat"' in open(path).read() and "dog" not in open(path).read()


def test_a_peft_model_is_refused_in_one_line():
    """A PEFT/LoRA model given to measure() failed with a raw AttributeError; it is refused, naming
    the fix (merge the adapters). Any object shaped like PEFT's wrapper is enough to show it."""
    import torch

    from effdepth_core.api import measure
    from effdepth_core.errors import EffdepthError

    class PeftModelForCausalLM(torch.nn.Module):
        config = object()  # PEFT forwards .config to the model it wraps

        def __init__(self) -> None:
            super().__init__()
            self.peft_config = {"default": object()}

        def get_base_model(self):
            return None

    with pytest.raises(EffdepthError, match=r"is a PEFT model.*merge_and_unload"):
        measure(PeftModelForCausalLM(), ["a prompt"], tokenizer=object())


def test_measure_names_a_wrong_argument_in_one_line(tmp_path, monkeypatch):
    """A hostile pass found raw TypeErrors and RuntimeErrors: a number or None for prompts, a
    tokenizer's name for the tokenizer, a 256-character prompt (taken for a file name too long), a
    path under a user with no home."""
    from conftest import char_tokenizer, make_tiny

    from effdepth_core.api import _prompts_task, measure
    from effdepth_core.errors import EffdepthError
    from effdepth_core.paths import user_path

    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    model = make_tiny("llama").model
    for prompts in (5, None):
        with pytest.raises(EffdepthError, match="measure takes a task name, one prompt or a list of prompts"):
            measure(model, prompts, tokenizer=char_tokenizer())
    with pytest.raises(EffdepthError, match=r"tokenizer= takes a tokenizer object.*AutoTokenizer"):
        measure(model, ["a"], tokenizer="gpt2")
    path, n, _ = _prompts_task("a" * 256)  # one long prompt, not a file name the file system refuses
    assert n == 1 and ("a" * 256) in open(path).read()
    with pytest.raises(EffdepthError, match=r"cannot expand '~nosuchuser0/x'"):
        user_path("~nosuchuser0/x")


def _takes_a_loaded_model(fn) -> bool:
    import inspect

    return any("LoadedModel" in str(p.annotation) for p in inspect.signature(fn).parameters.values())


def test_every_public_function_that_takes_a_loaded_model_takes_a_transformers_model_too():
    import inspect

    import effdepth_core
    from effdepth_core.measurement import probes

    public = {getattr(m, n) for m in (effdepth_core, probes) for n in m.__all__}
    takers = {fn for fn in public if inspect.isfunction(fn) and _takes_a_loaded_model(fn)}
    assert {"residual_cosine", "logit_lens", "skip_effects", "cross_model_map"} <= {fn.__name__ for fn in takers}
    # the rule, for every such function: it is wrapped, and its signature offers tokenizer=
    missing = sorted(fn.__name__ for fn in takers if "tokenizer" not in inspect.signature(fn).parameters)
    assert not missing, f"these take only a LoadedModel: {missing} (decorate them with takes_plain_models)"


def test_a_probe_called_on_a_transformers_model_gives_the_wrapped_models_numbers_and_leaves_it_as_it_was():
    from effdepth_core.measurement.probes import lens_by_token, skip_effects

    model, tokenizer = make_tiny("llama").model, char_tokenizer()
    model.train().requires_grad_(True)
    model.model.layers[0].eval()  # a submodule's own mode is the caller's too
    loaded = make_tiny("llama")  # the same weights, wrapped by hand
    loaded.tokenizer = tokenizer
    assert residual_cosine(model, PROMPTS, tokenizer=tokenizer).equals(residual_cosine(loaded, PROMPTS))
    assert logit_lens(model, PROMPTS, tokenizer=tokenizer, top_k=3).equals(logit_lens(loaded, PROMPTS, top_k=3))
    assert lens_by_token(model, PROMPTS[0], tokenizer=tokenizer).equals(lens_by_token(loaded, PROMPTS[0]))
    ids = [torch.arange(3, 19)]  # token ids need no tokenizer
    assert skip_effects(model, ids, skip_positions=1).equals(skip_effects(loaded, ids, skip_positions=1))
    assert model.training and all(p.requires_grad for p in model.parameters())  # as the caller had it
    assert not model.model.layers[0].training and model.model.layers[1].training
    with pytest.raises(EffdepthError, match="pass tokenizer="):  # text without a tokenizer: the way out
        residual_cosine(model, PROMPTS)
    with pytest.raises(EffdepthError, match="loaded with its own tokenizer"):  # another tokenizer: refused
        residual_cosine(loaded, PROMPTS, tokenizer=char_tokenizer())
    bare = make_tiny("llama")  # a LoadedModel without a tokenizer takes the one given
    assert residual_cosine(bare, PROMPTS, tokenizer=tokenizer).equals(residual_cosine(loaded, PROMPTS))
    with pytest.raises(EffdepthError, match="goes with a model given in memory"):
        from effdepth_core.results import RunSettings, run

        run(RunSettings("smollm2-135m", "gsm8k"), tokenizer=tokenizer)
    with pytest.raises(EffdepthError, match="got str"):
        residual_cosine("smollm2-135m", PROMPTS)


def test_a_model_wrapped_again_unchanged_is_not_checked_again_and_any_change_is_checked(monkeypatch):
    """A probe called on a plain model wraps it on every call: the load-time checks run once per
    model as long as nothing they read changed — a replaced forward, a hook, a swapped module, a
    weight edited in place or a config field runs them again, and a model broken since is refused."""
    from effdepth_core.measurement import adapters, checks
    from effdepth_core.models import wrap_model

    model = make_tiny("llama").model
    adapters._CHECKED.pop(model)  # make_tiny checked it: start from a model never wrapped
    runs = []
    checked = checks.verify_adapter
    monkeypatch.setattr(checks, "verify_adapter", lambda *a, **k: runs.append(1) or checked(*a, **k))
    first = wrap_model(model)
    again = wrap_model(model)
    assert len(runs) == 1 and (again.adapter, again.pads_safely) == (first.adapter, first.pads_safely)
    assert again.layers is first.layers and again.final_norm is first.final_norm
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *a: None)
    wrap_model(model)
    handle.remove()
    wrap_model(model)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(2.0)
    wrap_model(model)
    model.model.layers[0].mlp = copy.deepcopy(model.model.layers[0].mlp)
    wrap_model(model)
    model.config.rms_norm_eps = 1e-3
    wrap_model(model)
    assert len(runs) == 6  # the first wrap, then one per change: the hook, its removal, weight, module, config
    kernel = model.config._attn_implementation  # another attention kernel: the padding check again
    model.config._attn_implementation = "sdpa" if kernel == "eager" else "eager"
    wrap_model(model)
    wrap_model(model, name="another label")  # its warnings would name the model: checked under its name
    wrap_model(model, name="another label")
    assert len(runs) == 8
    layer_class = type(model.model.layers[0])
    own_forward = layer_class.forward
    monkeypatch.setattr(layer_class, "forward", lambda self, *a, **k: own_forward(self, *a, **k) * 1.5)
    with pytest.raises(UnsupportedModelError):  # a class patched in place: checked, and refused
        wrap_model(model)
    monkeypatch.setattr(layer_class, "forward", own_forward)
    block = model.model.layers[1]
    own = block.forward
    block.forward = lambda *args, **kwargs: own(*args, **kwargs) * 1.5  # no longer residual + two writes
    with pytest.raises(UnsupportedModelError):
        wrap_model(model)


def test_a_model_whose_layout_was_inferred_is_inferred_once(monkeypatch):
    """The cache holds for an inferred layout too (what the check's forwards update is read after
    them), and the inference's warning is given on every wrap."""
    from effdepth_core.errors import EffdepthWarning
    from effdepth_core.measurement import adapters
    from effdepth_core.models import wrap_model

    model = make_tiny("llama").model
    adapters._CHECKED.pop(model)
    monkeypatch.delitem(adapters.ADAPTERS, "llama")  # not in the table: inferred
    runs = []
    inferred = adapters.infer_adapter
    monkeypatch.setattr(adapters, "infer_adapter", lambda *a, **k: runs.append(1) or inferred(*a, **k))
    for _ in range(2):
        with pytest.warns(EffdepthWarning, match="inferred"):
            wrap_model(model)
    assert len(runs) == 1


def test_every_probe_option_has_one_spelling_in_python_and_on_the_command_line():
    """A public function's keyword for a probe option is the option's own name (``skip_variants``
    in ``skip_effects``, ``measure`` and, as ``--skip-variants``, on the command line), never a
    short form of it (``variants``, ``n_positions``, ``block_sizes``, ``tolerance``)."""
    import inspect

    import effdepth_core
    from effdepth_core.cli_args import build_parser
    from effdepth_core.measurement import probes, registry

    options = set(registry.options())
    short = {o.split("_", 1)[1] for o in options if "_" in o} | {"tolerance", "block_sizes", "n_positions"}
    functions = {getattr(m, n) for m in (effdepth_core, probes) for n in m.__all__}
    for fn in (f for f in functions if inspect.isfunction(f) and _takes_a_loaded_model(f)):  # the probes
        for name in inspect.signature(fn).parameters:
            stands_for = name in short or any(name.endswith("_" + s) for s in short)
            assert name in options or not stands_for, f"{fn.__name__}({name}=) spells an option another way"
    run_flags = {a.dest for a in build_parser("run")._subparsers._group_actions[0].choices["run"]._actions}
    assert options <= run_flags  # and each is `effdepth run --<name with dashes>`


def test_a_measurement_reads_like_what_was_passed_and_draws_every_probe(cache):
    model, tokenizer = make_tiny("llama").model, char_tokenizer()
    result = measure(model, PROMPTS, tokenizer=tokenizer, progress=False, name="my llama")
    text = repr(result)
    assert text.startswith("<Measurement: my llama on 2 prompts (3 layers, n = 2). ED cosine "), text
    assert "Probes: cosine, logit_lens." in text and "cache" in text
    assert "<b>my llama</b> on <b>2 prompts</b>" in result._repr_html_()
    with pytest.raises(EffdepthError, match="name= labels the model"):
        measure(model, PROMPTS, tokenizer=tokenizer, progress=False, name="")
    drawn = result.plot()  # every probe's chart: the cosine curves and the lens panels
    titles = json.dumps(drawn.spec)
    assert "vconcat" in drawn.spec and "KL" in titles and "cos" in titles.lower()
    assert "my llama" in titles and "2 prompts" in titles and "prompts/" not in titles  # labels, not cache paths


def test_a_misspelt_or_short_option_name_is_answered_with_the_one_it_means(capsys):
    from effdepth_core.cli import main
    from effdepth_core.errors import nearest_name

    names = ["igrad_steps", "igrad_max_steps", "igrad_tol", "prune_sizes", "batch_size", "lens_steps", "top_k"]
    asked = {"max_steps": "igrad_max_steps", "tolerance": "igrad_tol", "block_sizes": "prune_sizes", "topk": "top_k"}
    for given, meant in asked.items():
        assert nearest_name(given, names) == meant, given
    assert nearest_name("zzz", names) is None
    for given, meant in (("max_steps", "igrad_max_steps"), ("variants", "skip_variants"), ("tolerance", "igrad_tol")):
        with pytest.raises(EffdepthError, match=f"did you mean {meant}\\?"):
            measure("smollm2-135m", "gsm8k", **{given: 1})
    with pytest.raises(SystemExit):
        main(["run", "--max-steps", "3"])
    assert "did you mean --igrad-max-steps?" in capsys.readouterr().err


def test_curves_as_arrays_and_the_one_prompt_prediction_table(cache):
    from effdepth_core.measurement.probes import lens_by_token, prediction_table

    tiny = make_tiny("llama")
    result = measure(tiny.model, PROMPTS, tokenizer=char_tokenizer(), progress=False)
    kl = result.curve("logit_lens", "kl")
    frame = result.curves["logit_lens"].filter(metric="kl").sort("layer")
    assert kl.tolist() == frame["value"].to_list() and len(kl) == tiny.n_layers + 1
    with pytest.raises(EffdepthError, match="no metric 'kll' \\(did you mean 'kl'\\?\\)"):
        result.curve("logit_lens", "kll")
    with pytest.raises(EffdepthError, match="no probe 'lens'"):
        result.curve("lens", "kl")
    rows = lens_by_token(tiny.model, PROMPTS[0], tokenizer=char_tokenizer(), top_k=3)
    for rank in (0, 2):
        table = prediction_table(rows, rank)
        assert table["layer"].to_list() == list(range(tiny.n_layers + 1))
        for layer, position, tokens in rows.select("layer", "position", "top_tokens").iter_rows():
            column = next(c for c in table.columns if c.split(" ", 1)[0] == str(position))
            assert table.filter(layer=layer)[column].item() == tokens[rank]  # the lens's rank-th token there
    with pytest.raises(EffdepthError, match="rank must be below the top_k kept \\(3\\)"):
        prediction_table(rows, 3)


def test_the_in_memory_road_finds_every_mistake_before_a_model_loads(monkeypatch, cache):
    """``measure(name, …, cache=False)`` takes ``run_in_memory`` without a model in hand: its
    settings, task and examples are checked before anything loads (or downloads), as ``run`` does."""
    from effdepth_core import results

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(results, "load_model", no_load)
    for settings, said in (
        ({"level": 3}, "level= \\(--level\\) applies to the math task only"),
        ({"max_tokens": 9, "task": "addition"}, "max_tokens= \\(--max-tokens\\) applies to data-set tasks"),
        ({"n": 0}, "n"),
    ):
        task = settings.pop("task", "gsm8k")
        with pytest.raises(EffdepthError, match=said):
            measure("smollm2-135m", task, cache=False, progress=False, **settings)


def test_a_task_path_that_does_not_exist_is_refused_with_the_nearest_file_not_measured(cache, capsys):
    """A typo in a task file's path was measured as the one prompt "tasks/my_tasks.jsonl": now a
    one-word text ending in .jsonl/.json that names no file is refused, naming the file meant,
    from Python (TaskError) and from the command line (one line, exit 2); a prompt that merely
    mentions a file (it has spaces) is still a prompt."""
    from effdepth_core.cli import main
    from effdepth_core.errors import TaskError

    (cache / "tasks").mkdir()
    (cache / "tasks" / "my_task.jsonl").write_text('{"prompt": "the cat sat"}\n')
    tiny = make_tiny("llama")
    with pytest.raises(
        TaskError, match=re.escape("'tasks/my_tasks.jsonl' does not exist (did you mean 'tasks/my_task")
    ):
        measure(tiny.model, "tasks/my_tasks.jsonl", tokenizer=char_tokenizer(), progress=False)
    with pytest.raises(
        TaskError, match=re.escape("'elsewhere/x.json' does not exist (nor does its folder 'elsewhere')")
    ):
        measure(tiny.model, "elsewhere/x.json", tokenizer=char_tokenizer(), progress=False)
    capsys.readouterr()
    code = main(["run", "--model", "smollm2-135m", "--task", "tasks/my_tasks.jsonl", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "did you mean 'tasks/my_task.jsonl'?" in err[0], err
    kept = measure(tiny.model, "open config.json", tokenizer=char_tokenizer(), progress=False)
    assert kept.summary["n_examples"] == 1 and kept.task_label == "1 prompt"


def _bad_inputs():
    """Each wrong input to the one-prompt functions, the table and curve(): (id, call, what the one line says)."""
    from effdepth_core.measurement.probes import lens_by_token, logit_lens, prediction_table

    tiny = make_tiny("llama")
    tiny.tokenizer = char_tokenizer()
    rows = lens_by_token(tiny, PROMPTS[0], top_k=3)
    two = torch.tensor([[5, 6, 7], [8, 9, 10]])  # two 3-token prompts, once read as one 6-token prompt
    return {
        name: (call, said)
        for name, call, said in [
            ("2-D batch of two prompts", lambda: lens_by_token(tiny, two), "reads one prompt.*shape \\[2, 3\\]"),
            ("a list of prompts", lambda: lens_by_token(tiny, PROMPTS), "reads one prompt.*a list of 2"),
            ("top_k=2.5", lambda: lens_by_token(tiny, PROMPTS[0], top_k=2.5), "whole number of at least 1, got 2.5"),
            ("top_k=nan", lambda: lens_by_token(tiny, PROMPTS[0], top_k=float("nan")), "whole number.*got nan"),
            ("lens='tuned'", lambda: lens_by_token(tiny, PROMPTS[0], lens="tuned"), "lens= takes a TunedLens.*'tuned'"),
            ("a lone surrogate", lambda: lens_by_token(tiny, "ab\ud800c"), "lone surrogate"),
            (
                "measure(tokenizer=123)",
                lambda: measure(make_tiny("llama").model, PROMPTS, tokenizer=123, progress=False),
                "tokenizer= takes the model's tokenizer object.*got int 123",
            ),
            ("prediction_table(None)", lambda: prediction_table(None), "polars frame for one prompt, got NoneType"),
            ("prediction_table(list)", lambda: prediction_table([rows]), "got list"),
            ("prediction_table(pandas)", lambda: prediction_table(rows.to_pandas()), "pl.from_pandas"),
            (
                "prediction_table(two prompts)",
                lambda: prediction_table(pl_concat(rows, tiny)),
                "rows of several prompts",
            ),
            ("prediction_table(logit_lens)", lambda: prediction_table(logit_lens(tiny, PROMPTS)), "has no position"),
        ]
    }


BAD_INPUTS = ["2-D batch of two prompts", "a list of prompts", "top_k=2.5", "top_k=nan", "lens='tuned'",
              "a lone surrogate", "measure(tokenizer=123)", "prediction_table(None)", "prediction_table(list)",
              "prediction_table(pandas)", "prediction_table(two prompts)", "prediction_table(logit_lens)"]  # fmt: skip


def pl_concat(rows, tiny):
    """Two prompts' lens_by_token rows in one frame."""
    import polars as pl

    from effdepth_core.measurement.probes import lens_by_token

    return pl.concat([rows, lens_by_token(tiny, PROMPTS[1], top_k=3)])


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_each_bad_input_to_the_newer_functions_is_one_line(cache, case):
    """Issue 47's list: each was a raw TypeError, AttributeError or polars error (or a wrong result:
    a 2-D batch read as one prompt); each is now an EffdepthError naming the fix."""
    cases = _bad_inputs()
    assert sorted(cases) == sorted(BAD_INPUTS)
    call, said = cases[case]
    with pytest.raises(EffdepthError, match=said) as info:
        call()
    assert "\n" not in str(info.value), case


@pytest.mark.parametrize("given", [None, float("nan"), ["kl"], {}])
def test_curve_names_a_non_text_probe_or_metric_in_one_line(cache, given):
    result = measure(make_tiny("llama").model, PROMPTS, tokenizer=char_tokenizer(), progress=False)
    with pytest.raises(EffdepthError, match="curve\\(\\) takes a metric name as text"):
        result.curve("logit_lens", given)
    with pytest.raises(EffdepthError, match="curve\\(\\) takes a probe name as text"):
        result.curve(given, "kl")


def test_one_prompt_as_a_1_by_n_tensor_is_that_prompt():
    """A ``[1, token]`` tensor (a tokenizer's ``return_tensors="pt"``) is one prompt: the same rows as its 1-D ids."""
    from effdepth_core.measurement.probes import lens_by_token

    tiny = make_tiny("llama")
    ids = torch.tensor([5, 6, 7, 8])
    assert lens_by_token(tiny, ids[None], top_k=2).equals(lens_by_token(tiny, ids, top_k=2))


def test_the_result_marks_its_degenerate_eds_and_shows_every_column(cache):
    """A 3-layer model's EDs all lie in its first layers (ED ≤ max(2, ⌈0.3⌉) = 2): each is a rule
    artefact by docs/method.md §10. The repr marks each cell † and says why in one line; ``eds``
    names the reason per rule; printed, the frame keeps all its columns and full reasons (polars
    would cut it to 100 characters: issue 47's "result.eds is truncated")."""
    result = measure(make_tiny("llama").model, PROMPTS, tokenizer=char_tokenizer(), progress=False)
    eds = result.eds
    for rule, ed in zip(eds["rule"], eds["ed"], strict=True):
        assert 0 <= ed <= 2, rule
        expected = f"it fires at layer {ed}, in the first layers (0–2 of 3)"
        assert eds.filter(rule=rule)["degenerate"].item() == expected
    text = repr(result)
    assert text.count("†") == 2 * eds.height + 1  # each ED and depth cell, and the legend
    assert "(docs/method.md §10, not a depth): cosine: it fires at layer" in text and "\n" not in text
    printed = str(eds)
    assert "…" not in printed and all(column in printed for column in eds.columns)
    assert "in the first layers (0–2 of 3)" in printed and "degenerate" in result._repr_html_()
    assert eds.filter(rule="cosine")["ed"].item() == result.summary["cosine"]["ed"]  # still a polars frame


def test_one_text_one_measurement_by_either_route(cache, tiny_dir, capsys):
    """Issue 47: README's task file measured prompt + answer and its list of prompts the prompts
    alone, so the "same two prompts" gave other EDs. A line's text is prompt + answer on both
    routes: the command line on the file, measure() on the file, and measure() on the joined texts
    give the same numbers; with_answer=False (named, and said in the result) measures the prompts
    alone, which equal measure() of those prompts — and differ from the texts with answers."""
    import polars as pl

    from effdepth_core.api import TEXT_AS_GIVEN, TEXT_PROMPT_ONLY, TEXT_WITH_ANSWER
    from effdepth_core.cli import main

    lines = [("the cat sat on", " the mat"), ("two plus", " two is four")]
    task = cache / "mine.jsonl"
    task.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in lines))
    capsys.readouterr()
    assert (
        main(["run", "--model", str(tiny_dir), "--task", str(task), "--out", str(cache / "cli"), "--no-progress"]) == 0
    )
    assert "measured text: each example's prompt + answer (2 of 2 have one" in capsys.readouterr().out
    cli = {name: pl.read_parquet(cache / "cli" / f"{name}_by_example.parquet") for name in ("cosine", "logit_lens")}
    model = str(tiny_dir)
    joined = measure(model, [p + a for p, a in lines], cache=False, progress=False)
    on_file = measure(model, str(task), cache=False, progress=False)
    for name, frame in cli.items():
        assert joined.per_example[name].equals(frame), name  # same text, same batches: bit-identical
        assert on_file.per_example[name].equals(frame), name
    assert joined.summary["logit_lens_kl"] == on_file.summary["logit_lens_kl"]
    assert (on_file.text, joined.text) == (TEXT_WITH_ANSWER, TEXT_AS_GIVEN) and "prompt + answer" in repr(on_file)
    alone = measure(model, str(task), cache=False, progress=False, with_answer=False)
    prompts = measure(model, [p for p, _ in lines], cache=False, progress=False)
    assert alone.text == TEXT_PROMPT_ONLY and "with_answer=False" in repr(alone)
    for name in cli:
        assert alone.per_example[name].equals(prompts.per_example[name]), name
        assert not alone.per_example[name].equals(on_file.per_example[name]), name  # other text, other numbers
    with pytest.raises(EffdepthError, match="with_answer=False takes a task file or a list"):
        measure(model, "gsm8k", with_answer=False, cache=False)
    with pytest.raises(EffdepthError, match="with_answer= takes True or False"):
        measure(model, str(task), with_answer="no", cache=False)
