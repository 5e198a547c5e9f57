"""Cross-model linear map (method.md §7, Csordás Analysis 5): how well an affine map of a small
model's residual h_m predicts a big model's h_l on the same tokens. A valley of the held-out error
along equal *relative* depth means the deep model stretches the shallow one's computation.

As a measurement (``fit_map``): the ridge penalty of each small layer's maps is chosen on held-out
validation tokens; a baseline map is fitted on the same tokens with their pairing shuffled (what a
map learns without a token-by-token correspondence); the test error is kept per test prompt, so a
statistic of the map gets a bootstrap interval over prompts.

Memory is bounded, whatever the number of training tokens: the normal equations are accumulated
(G_m = X̃_mᵀX̃_m and C_ml = X̃_mᵀY_l, X̃ = [h_m, 1]) for as many small layers at a time as fit in
``memory_budget_mb``, one streamed pass over the training tokens per such chunk. The training
residuals of both models are computed once and spilled to a temporary folder batch by batch (disk,
not memory, grows with the number of tokens), so later passes cost reading, not forwards; only the
held-out tokens' residuals are kept in memory whole.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import polars as pl
import torch

from .errors import EffdepthError
from .measurement.trace import residual_states, show_progress, tokenize
from .measurement.wrapping import LoadedModel, takes_plain_models
from .terminal import progress_bar

StateStream = Callable[[], Iterable[torch.Tensor]]  # each call: batches of [token, layer 0..L, d] float32


def check_same_tokenizer(small: LoadedModel, big: LoadedModel) -> None:
    """One-line error unless both models read the same token ids (the map needs one token stream)."""
    vocab = [m.tokenizer.get_vocab() if m.tokenizer is not None else None for m in (small, big)]
    if vocab[0] is None or vocab[1] is None or vocab[0] != vocab[1]:
        sizes = " vs ".join(str(len(v)) if v is not None else "no tokenizer" for v in vocab)
        raise EffdepthError(
            f"{small.name} and {big.name} do not share a tokenizer (vocabularies: {sizes}); the map needs both "
            "models on the same tokens: pick two models of one family"
        )


def _spilled(states: Iterable[torch.Tensor], folder: Path) -> StateStream:
    """Write each batch of states to ``folder`` once; the returned stream reads them back in order."""
    folder.mkdir()
    files = []
    for index, batch in enumerate(states):
        files.append(folder / f"{index:06d}.pt")
        torch.save(batch, files[-1])
    return lambda: (torch.load(f) for f in files)


def _with_bias(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, torch.ones(*x.shape[:-1], 1, dtype=x.dtype)], dim=-1)


def normal_equations(
    train_small: StateStream, train_big: StateStream, layers: list[int], p: int, width: int, seed: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """One pass over the training tokens: per small layer in ``layers`` the Gram matrix ``[p, p]``
    of its residuals (with a bias column), their products with the big model's ``[p, width]``, the
    same with the big model's tokens shuffled (``seed`` given: the baseline without correspondence),
    and the number of tokens seen."""
    gram = torch.zeros(len(layers), p, p, dtype=torch.float64)
    cross = torch.zeros(len(layers), p, width, dtype=torch.float64)
    shuffled = torch.zeros_like(cross) if seed is not None else None
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    seen = 0
    for xs, ys in zip(train_small(), train_big(), strict=True):
        if xs.shape[0] != ys.shape[0]:
            raise EffdepthError("the two models saw different numbers of tokens; they must share a tokenizer")
        x = _with_bias(xs[:, layers].double()).transpose(0, 1)  # [chunk, token, p]
        y = ys.double().reshape(ys.shape[0], -1)  # [token, big layer · d_big]
        gram += x.transpose(1, 2) @ x
        cross += x.transpose(1, 2) @ y
        if shuffled is not None:
            shuffled += x.transpose(1, 2) @ y[torch.randperm(y.shape[0], generator=generator)]
        seen += xs.shape[0]
    return gram, cross, shuffled, seen


def fit_errors(
    train_small: StateStream,
    train_big: StateStream,
    test_small: torch.Tensor,
    test_big: torch.Tensor,
    ridge: float = 0.0,
    memory_budget_mb: int = 1024,
    progress: bool | None = None,
) -> torch.Tensor:
    """Held-out relative error ``[small layer, big layer]``: mean over test tokens of
    |h_l − f(h_m)| / |h_l| for the least-squares affine f fitted on the training streams (with
    ``ridge`` on the weights, not the bias). ``test_*``: ``[token, layer, d]``."""
    n_small, d_small = test_small.shape[1], test_small.shape[2]
    n_big, d_big = test_big.shape[1], test_big.shape[2]
    p = d_small + 1
    per_layer = 8 * p * (p + n_big * d_big)  # float64 G_m and C_m·
    chunk = max(1, min(n_small, (memory_budget_mb << 20) // per_layer))
    errors = torch.empty(n_small, n_big, dtype=torch.float64)
    y_test = test_big.double()  # [token, big layer, d_big]
    y_norm = y_test.norm(dim=-1).clamp_min(1e-12)
    passes = range(0, n_small, chunk)
    for first in progress_bar(passes, desc="linear map", unit="pass", disable=not show_progress(progress)):
        layers = list(range(first, min(first + chunk, n_small)))
        gram, cross, _, seen = normal_equations(train_small, train_big, layers, p, n_big * d_big)
        if seen <= p and ridge == 0:
            raise EffdepthError(f"{seen} training tokens for {p} unknowns per map: give more prompts or a --ridge")
        penalty = torch.diag(torch.cat([torch.full((d_small,), ridge, dtype=torch.float64), torch.zeros(1).double()]))
        weights = torch.linalg.lstsq(gram + penalty, cross).solution  # [chunk, p, big layer · d_big]
        for index, m in enumerate(layers):
            prediction = (_with_bias(test_small[:, m].double()) @ weights[index]).view(-1, n_big, d_big)
            errors[m] = ((y_test - prediction).norm(dim=-1) / y_norm).mean(dim=0)
    return errors


# shares of each input dimension's own second moment (the Gram matrix's diagonal entry): a residual
# stream's few massive dimensions would make a share of the *mean* diagonal a heavy penalty on every
# other dimension, shrinking even a perfect map (a model onto itself: 0.03–0.12 off the identity)
RIDGES = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)


class MapFit:
    """What ``fit_map`` measured: per small layer m and big layer l the test error of the map
    (``errors`` ``[m, l]``, mean over test tokens), of the shuffled-pairing baseline (``baseline``),
    the error per test token (``per_token`` ``[token, m, l]``) and the ridge chosen per map (``ridges`` ``[m, l]``)."""

    def __init__(self, errors, baseline, per_token, ridges):
        self.errors, self.baseline, self.per_token, self.ridges = errors, baseline, per_token, ridges


def _relative_errors(x: torch.Tensor, weights: torch.Tensor, y: torch.Tensor, y_norm: torch.Tensor) -> torch.Tensor:
    """|y − f(x)| / |y| per token and big layer ``[token, big layer]``; ``y`` ``[token, big layer, d]``."""
    prediction = (_with_bias(x) @ weights).view(*y.shape)
    return (y - prediction).norm(dim=-1) / y_norm


def fit_map(
    train_small: StateStream,
    train_big: StateStream,
    validation: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    ridges: Sequence[float] = RIDGES,
    memory_budget_mb: int = 1024,
    seed: int = 0,
    progress: bool | None = None,
) -> MapFit:
    """Maps from every small layer to every big layer on the training streams; per map m → l the
    ridge (a share of each dimension's Gram diagonal entry, on the weights, not the bias) with the least
    mean validation error of that map; the test error of those maps and of maps fitted with the big
    model's tokens shuffled against the small model's (within each streamed batch), under the same
    ridge. ``validation`` and ``test``: (small, big) states ``[token, layer, d]``."""
    test_small, test_big = test
    val_small, val_big = validation
    n_small, d_small = test_small.shape[1], test_small.shape[2]
    n_big, d_big = test_big.shape[1], test_big.shape[2]
    p = d_small + 1
    per_layer = 8 * p * (p + 2 * n_big * d_big)  # float64 G_m and two C_m·
    chunk = max(1, min(n_small, (memory_budget_mb << 20) // per_layer))
    y_test, y_val = test_big.double(), val_big.double()
    norm_test, norm_val = y_test.norm(dim=-1).clamp_min(1e-12), y_val.norm(dim=-1).clamp_min(1e-12)
    errors = torch.empty(n_small, n_big, dtype=torch.float64)
    baseline = torch.empty(n_small, n_big, dtype=torch.float64)
    per_token = torch.empty(test_small.shape[0], n_small, n_big, dtype=torch.float64)
    chosen = torch.zeros(n_small, n_big, dtype=torch.float64)
    for first in progress_bar(
        range(0, n_small, chunk), desc="linear map", unit="pass", disable=not show_progress(progress)
    ):
        layers = list(range(first, min(first + chunk, n_small)))
        gram, cross, shuffled, seen = normal_equations(train_small, train_big, layers, p, n_big * d_big, seed)
        for index, m in enumerate(layers):
            # each map m → l is its own regression: choosing one ridge for all l would let the
            # off-diagonal targets, which gain from shrinkage, shrink a map that needs none (a self-map)
            scale = gram[index].diagonal()[:d_small].clamp_min(1e-300)  # [d_small]: each dimension's own
            best = torch.full((n_big,), float("inf"), dtype=torch.float64)
            weights = torch.zeros(p, n_big * d_big, dtype=torch.float64)  # per column block: its chosen ridge's
            blind = torch.zeros_like(weights)
            for share in ridges:
                if share == 0 and seen <= p:
                    continue
                system = gram[index] + torch.diag(torch.cat([share * scale, torch.zeros(1, dtype=torch.float64)]))
                solved = torch.linalg.lstsq(system, cross[index]).solution  # [p, big layer · d_big]
                score = _relative_errors(val_small[:, m].double(), solved, y_val, norm_val).mean(dim=0)  # [l]
                better = score < best
                if better.any():
                    columns = better.repeat_interleave(d_big)
                    best[better], chosen[m, better] = score[better], share
                    weights[:, columns] = solved[:, columns]
                    blind[:, columns] = torch.linalg.lstsq(system, shuffled[index]).solution[:, columns]
            if not torch.isfinite(best).all():
                raise EffdepthError(f"{seen} training tokens for {p} unknowns per map: give more prompts")
            tokens = _relative_errors(test_small[:, m].double(), weights, y_test, norm_test)
            per_token[:, m] = tokens
            errors[m] = tokens.mean(dim=0)
            baseline[m] = _relative_errors(test_small[:, m].double(), blind, y_test, norm_test).mean(dim=0)
    return MapFit(errors, baseline, per_token, chosen)


@takes_plain_models("small", "big")
def cross_model_map(
    small: LoadedModel,
    big: LoadedModel,
    train_prompts: Sequence[str | torch.Tensor],
    test_prompts: Sequence[str | torch.Tensor],
    ridge: float = 0.0,
    batch_size: int = 4,
    memory_budget_mb: int = 1024,
    progress: bool | None = None,
) -> pl.DataFrame:
    """The held-out error of the affine map from each small layer m to each big layer l (0..L each,
    m = 0 the embedding), as a long frame ``small_layer, big_layer, metric, value`` (metric
    ``relative_error``), plus per small layer (``big_layer`` null) ``best_big_layer`` (the l with the
    least error) and ``equal_depth_layer`` (m · L_big / L_small, where equal relative depth puts it).
    Train and test prompts must be disjoint; both models read the small model's token ids.

    Args:
        small, big: the two models (the small one's tokenizer is used for both).
        train_prompts, test_prompts: disjoint prompts to fit the maps on and to score them on.
        ridge: the ridge penalty of the least-squares fit (0: plain least squares).
        batch_size: prompts per forward pass.
        memory_budget_mb: memory the stacked hidden states may take.
        progress: show progress bars (None: when attached to a terminal or notebook).
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        The long frame above.
    """
    check_same_tokenizer(small, big)
    train, test = tokenize(small, train_prompts), tokenize(small, test_prompts)
    tokenize(big, [ids for ids in train + test])  # the big model's context length applies too
    test_small = torch.cat(list(residual_states(small, test, batch_size)))
    test_big = torch.cat(list(residual_states(big, test, batch_size)))
    with tempfile.TemporaryDirectory(prefix="effdepth-map-") as spill:
        streams = [
            _spilled(residual_states(m, train, batch_size), Path(spill) / name)
            for m, name in ((small, "small"), (big, "big"))
        ]
        errors = fit_errors(
            *streams, test_small, test_big, ridge=ridge, memory_budget_mb=memory_budget_mb, progress=progress
        )
    rows = [
        (m, b, "relative_error", float(errors[m, b])) for m in range(errors.shape[0]) for b in range(errors.shape[1])
    ]
    scale = (big.n_layers) / max(small.n_layers, 1)
    for m in range(errors.shape[0]):
        rows.append((m, None, "best_big_layer", float(errors[m].argmin())))
        rows.append((m, None, "equal_depth_layer", m * scale))
    schema = {"small_layer": pl.Int64, "big_layer": pl.Int64, "metric": pl.String, "value": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def _states_per_prompt(loaded: LoadedModel, token_lists: list[torch.Tensor], batch_size: int) -> list[torch.Tensor]:
    return [torch.cat(list(residual_states(loaded, [ids], batch_size))) for ids in token_lists]


def map_measurement(
    small: LoadedModel,
    big: LoadedModel,
    train_prompts: Sequence[str | torch.Tensor],
    validation_prompts: Sequence[str | torch.Tensor],
    test_prompts: Sequence[str | torch.Tensor],
    ridges: Sequence[float] = RIDGES,
    batch_size: int = 4,
    memory_budget_mb: int = 1024,
    seed: int = 0,
    progress: bool | None = None,
) -> pl.DataFrame:
    """The map as a measurement (method.md §7): per small layer m and big layer l the test error
    (``relative_error``), the shuffled-pairing baseline (``baseline_error``) and, per test prompt,
    the error (rows with a ``prompt``); per map the chosen ``ridge``; per m ``best_big_layer`` and
    ``equal_depth_layer``; and the small model mapped onto itself (``self_error``, ``big_layer`` the
    small model's layer: the identity, error ≈ 0 on the diagonal, checks the fit)."""
    check_same_tokenizer(small, big)
    train = tokenize(small, train_prompts)
    validation, test = tokenize(small, validation_prompts), tokenize(small, test_prompts)
    tokenize(big, [ids for ids in train + validation + test])  # the big model's context length applies too
    test_small = _states_per_prompt(small, test, batch_size)
    test_big = _states_per_prompt(big, test, batch_size)
    owner = torch.cat([torch.full((s.shape[0],), i) for i, s in enumerate(test_small)])  # [token] → prompt
    held = {
        "test": (torch.cat(test_small), torch.cat(test_big)),
        "validation": tuple(torch.cat(list(residual_states(m, validation, batch_size))) for m in (small, big)),
    }
    with tempfile.TemporaryDirectory(prefix="effdepth-map-") as spill:
        streams = {
            name: _spilled(residual_states(m, train, batch_size), Path(spill) / name)
            for m, name in ((small, "small"), (big, "big"))
        }
        fit = fit_map(
            streams["small"], streams["big"], held["validation"], held["test"], ridges, memory_budget_mb, seed, progress
        )
        own = fit_map(  # the same procedure onto itself must give the identity: it checks the ridge choice too
            streams["small"],
            streams["small"],
            (held["validation"][0],) * 2,
            (held["test"][0],) * 2,
            ridges,
            memory_budget_mb,
            seed,
            progress,
        )
    rows = []
    n_small, n_big = fit.errors.shape
    for m in range(n_small):
        rows += [(None, m, b, "relative_error", float(fit.errors[m, b])) for b in range(n_big)]
        rows += [(None, m, b, "baseline_error", float(fit.baseline[m, b])) for b in range(n_big)]
        rows += [(None, m, b, "self_error", float(own.errors[m, b])) for b in range(n_small)]
        rows += [(None, m, b, "ridge", float(fit.ridges[m, b])) for b in range(n_big)]
        rows.append((None, m, None, "best_big_layer", float(fit.errors[m].argmin())))
        rows.append((None, m, None, "equal_depth_layer", m * big.n_layers / max(small.n_layers, 1)))
    for prompt in range(len(test)):
        means = fit.per_token[owner == prompt].mean(dim=0)  # [m, l]
        rows += [(prompt, m, b, "relative_error", float(means[m, b])) for m in range(n_small) for b in range(n_big)]
    schema = {
        "prompt": pl.Int64,
        "small_layer": pl.Int64,
        "big_layer": pl.Int64,
        "metric": pl.String,
        "value": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema, orient="row")
