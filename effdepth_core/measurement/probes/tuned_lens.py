"""Tuned lens (method.md §7a; Belrose et al. 2023): per-layer affine translators
T_l(h) = h + A_l h + b_l, trained so that Head(FinalNorm(T_l(h_l))) matches the model's final
distribution. The logit lens is the tuned lens with A_l = 0, b_l = 0, so the lens probe, its ED
rules and the early-exit probe take either one.

Training (``train_tuned_lens``) follows Belrose et al.'s objective — the forward KL(p_final ‖ q_l),
summed over layers, on text disjoint from every probed prompt (``tasks.lens_corpus``) — with two
changes that make it affordable on a CPU: each translator starts from the better (on training
tokens) of zero and a least-squares fit of h_L − h_l on h_l (each token weighted by 1 / |h_L|, so
that a few huge residuals do not dominate), and Adam replaces SGD with Nesterov momentum. Trained
lenses are cached next to the model (``tuned_lens_path``), keyed by the model's identity, the
corpus and the training settings.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl
import torch
from torch import nn

from ...cache import (
    NotARegularFile,
    atomic_write_bytes,
    atomic_write_json,
    cache_dir,
    check_file,
    file_record,
    make_dirs,
    read_json,
)
from ...errors import EffdepthError
from ...options import MAX_LENS_STEPS, MAX_LENS_TOKENS
from ...paths import short_name
from ...terminal import progress_bar
from ..identity import canary_comparable, canary_record, model_identity
from ..trace import residual_states, show_progress, tokenize
from ..wrapping import LoadedModel, takes_plain_models
from .shared.lens import KL_FRACTION_OPTION, OVERLAP_THRESHOLD_OPTION, TOP_K, check_top_k, lens_rules, logit_lens
from .shared.reduce import token_weighted_mean
from .spec import Context, Option, ProbeSpec, Shape, prompts_of

LENS_FORMAT = 1  # bump when training changes, so older cached lenses are not reused


class TunedLens(nn.Module):
    """Translators for layers 0..L-1 of one model; layer L (the final residual) is decoded as is."""

    def __init__(self, n_layers: int, d_model: int, info: dict | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_layers, d_model, d_model))  # [layer, d_out, d_in]: A_l
        self.bias = nn.Parameter(torch.zeros(n_layers, d_model))  # [layer, d_model]: b_l
        self.info = dict(info or {})

    @classmethod
    def identity(cls, loaded: LoadedModel) -> TunedLens:
        """Zero translators: decodes exactly as the logit lens."""
        return cls(loaded.n_layers, loaded.d_model, {"kind": "identity"})

    @property
    def n_layers(self) -> int:
        return int(self.weight.shape[0])

    def translate(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """T_layer(hidden) for ``hidden`` ``[..., d_model]``; the identity at layer L."""
        if layer >= self.n_layers:
            return hidden
        weight = self.weight[layer].to(hidden.device, hidden.dtype)
        bias = self.bias[layer].to(hidden.device, hidden.dtype)
        return hidden + nn.functional.linear(hidden, weight, bias)

    def save(self, path: Path) -> None:
        """Write atomically, then the record of its sha256 (``<file>.json``) that loads check it by."""
        from safetensors.torch import save

        tensors = {"weight": self.weight.detach().float().cpu().contiguous(), "bias": self.bias.detach().float().cpu()}
        metadata = {"effdepth_tuned_lens": json.dumps(self.info)}
        make_dirs(path.parent, 0o700)
        atomic_write_bytes(path, save(tensors, metadata=metadata), "no lens was cached there")
        atomic_write_json(record_path(path), {"format": LENS_FORMAT, **file_record(path)})

    @classmethod
    def load(cls, path: Path) -> TunedLens:
        """Read a cached lens after checking it against the sha256 recorded when it was written."""
        from safetensors import safe_open

        verify_lens_file(path)
        try:
            with safe_open(str(path), framework="pt") as handle:
                info = json.loads((handle.metadata() or {})["effdepth_tuned_lens"])
                weight, bias = handle.get_tensor("weight"), handle.get_tensor("bias")
        except Exception as exc:  # a damaged or foreign file: never silently replaced
            raise EffdepthError(
                f"cannot read the cached tuned lens {path} ({type(exc).__name__}); delete it to train it again"
            ) from exc
        finite = torch.isfinite(weight).all() and torch.isfinite(bias).all()
        if weight.ndim != 3 or bias.shape != weight.shape[:2] or not finite or not _valid_info(info, weight.shape[0]):
            raise EffdepthError(f"the cached tuned lens {path} is damaged; delete it to train it again")
        lens = cls(weight.shape[0], weight.shape[1], info)
        with torch.no_grad():
            lens.weight.copy_(weight)
            lens.bias.copy_(bias)
        return lens


def record_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def verify_lens_file(path: Path) -> str:
    """The sha256 of a cached lens file, after checking it is the one effdepth wrote (its record's
    sha256, re-hashed when its size, inode or times changed); one-line error otherwise."""
    try:
        record = read_json(record_path(path))
    except (OSError, ValueError, NotARegularFile):
        record = None
    state, fresh = check_file(path, record)
    if state == "unrecorded":
        raise EffdepthError(
            f"the cached tuned lens {path} is damaged; delete it to train it again (it carries no effdepth record "
            "of its sha256, so it cannot be verified: written by an older effdepth, or its record was removed)"
        )
    if state == "changed":
        raise EffdepthError(
            f"the cached tuned lens {path} is damaged; delete it to train it again (its sha256 differs from the "
            "one effdepth recorded when writing it)"
        )
    if state == "missing":
        raise EffdepthError(f"the cached tuned lens {path} is not a regular file; delete it to train it again")
    if fresh != record:  # same content, new inode or times (a copy, a restore): remember the new fingerprint
        try:
            atomic_write_json(record_path(path), {**record, **fresh})
        except EffdepthError:
            pass
    return fresh["sha256"]


def _valid_info(info, n_layers: int) -> bool:
    """The record a trained lens carries: a dict whose held-out KL lists are L finite numbers."""
    import math

    if not isinstance(info, dict):
        return False
    for key in ("heldout_kl_logit", "heldout_kl_tuned"):
        values = info.get(key, [])
        if not isinstance(values, list) or (values and len(values) != n_layers):
            return False
        if not all(type(v) in (int, float) and math.isfinite(v) for v in values):
            return False
    return True


@dataclass(frozen=True)
class LensTraining:
    """How a tuned lens is trained (all of it enters the cache key)."""

    train_tokens: int = 8192  # corpus tokens the translators are fitted on
    heldout_tokens: int = 1024  # corpus tokens (other texts) they are judged on
    steps: int = 200  # Adam steps
    batch_tokens: int = 64  # tokens per step
    lr: float = 1e-4  # Adam learning rate, decayed linearly to 0
    init: str = "regression"  # "regression" (least squares, when better than zero) or "zero"
    seed: int = 0

    def check(self) -> None:
        for name in ("train_tokens", "heldout_tokens", "steps", "batch_tokens"):
            if getattr(self, name) < 1:
                raise EffdepthError(
                    f"tuned-lens {name.replace('_', ' ')} must be at least 1, got {getattr(self, name)}"
                )
        if self.init not in ("regression", "zero"):
            raise EffdepthError(f"tuned-lens init must be 'regression' or 'zero', got {self.init!r}")
        if not self.lr > 0:
            raise EffdepthError(f"tuned-lens learning rate must be positive, got {self.lr}")


def _kl_to_final(loaded: LoadedModel, translated: torch.Tensor, final_logp: torch.Tensor, forward: bool):
    """Per-token KL between the lens's distribution q and the final p: KL(p ‖ q) (``forward``, the
    training loss) or KL(q ‖ p) (the probe's)."""
    logq = torch.log_softmax(loaded.head(translated).float(), dim=-1)
    if forward:
        return (final_logp.exp() * (final_logp - logq)).sum(-1)
    return (logq.exp() * (logq - final_logp)).sum(-1).clamp_min(0.0)


def _final_logp(loaded: LoadedModel, final: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(loaded.head(final).float(), dim=-1)


def _split_tokens(loaded: LoadedModel, texts: Sequence[str], training: LensTraining) -> tuple[list, list]:
    """Held-out texts first, then training texts, in a seeded order; whole texts, so no text is in both."""
    order = list(range(len(texts)))
    random.Random(training.seed).shuffle(order)
    token_lists = tokenize(loaded, [texts[i] for i in order], truncate=True)  # a corpus text is cut, not refused
    heldout, train, seen = [], [], 0
    for ids in token_lists:
        if seen < training.heldout_tokens:
            heldout.append(ids)
        elif seen < training.heldout_tokens + training.train_tokens:
            train.append(ids)
        else:
            break
        seen += ids.numel()
    if not train:
        raise EffdepthError("the tuned-lens corpus has too few tokens for a training split; lower heldout tokens")
    return heldout, train


def _regression_init(states: torch.Tensor, ridge: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares A_l, b_l of h_L − h_l ≈ A_l h_l + b_l per layer, each token weighted by 1/|h_L|
    (``states`` ``[token, L+1, d]``); ``ridge`` is relative to the Gram matrix's mean diagonal."""
    final = states[:, -1].double()
    weights = 1.0 / final.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # [token, 1]
    n_layers, d = states.shape[1] - 1, states.shape[2]
    A = torch.zeros(n_layers, d, d)
    b = torch.zeros(n_layers, d)
    for layer in range(n_layers):
        h = states[:, layer].double()
        x = torch.cat([h, torch.ones_like(h[:, :1])], dim=-1) * weights
        y = (final - h) * weights
        gram = x.T @ x
        gram += ridge * gram.diagonal().mean() * torch.eye(d + 1, dtype=gram.dtype)
        solution = torch.linalg.solve(gram, x.T @ y)  # [d+1, d]
        A[layer], b[layer] = solution[:d].T.float(), solution[d].float()
    return A, b


def _heldout_kl(loaded: LoadedModel, lens: TunedLens, states: torch.Tensor, chunk: int = 128) -> torch.Tensor:
    """Mean KL(q_l ‖ p) over ``states``' tokens for layers 0..L-1: ``[layer]``."""
    total = torch.zeros(lens.n_layers, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, states.shape[0], chunk):
            rows = states[start : start + chunk].to(loaded.head_device)
            final_logp = _final_logp(loaded, rows[:, -1].to(loaded.dtype))
            for layer in range(lens.n_layers):
                translated = lens.translate(layer, rows[:, layer].float()).to(loaded.dtype)
                total[layer] += _kl_to_final(loaded, translated, final_logp, forward=False).double().sum().cpu()
    return total / states.shape[0]


@takes_plain_models()
def train_tuned_lens(
    loaded: LoadedModel,
    texts: Sequence[str],
    training: LensTraining = LensTraining(),
    progress: bool | None = None,
) -> tuple[TunedLens, pl.DataFrame]:
    """Train translators for every layer of ``loaded`` on ``texts``. Returns the lens and its fit
    frame ``layer, metric, value`` with the held-out KL(q_l ‖ p) of the logit lens
    (``heldout_kl_logit``) and the tuned lens (``heldout_kl_tuned``) for layers 0..L-1.

    Args:
        loaded: a ``LoadedModel`` (``load_model``/``wrap_model``) or a transformers causal LM.
        texts: training and held-out text.
        training: token counts, steps, learning rate, initialisation and seed.
        progress: show progress bars (None: when attached to a terminal or notebook).
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        (the ``TunedLens``, its fit frame).
    """
    training.check()
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(training.seed)
    heldout_ids, train_ids = _split_tokens(loaded, texts, training)
    states = torch.cat(list(residual_states(loaded, train_ids)))  # [token, L+1, d] float32
    heldout = torch.cat(list(residual_states(loaded, heldout_ids)))
    if states.shape[0] < training.train_tokens:  # done otherwise than asked: said, and recorded as done
        import warnings

        from ...errors import EffdepthWarning

        warnings.warn(
            f"tuned lens of {loaded.name}: the corpus holds {states.shape[0]} training tokens, fewer than the "
            f"{training.train_tokens} asked (lens_tokens); it is trained on {states.shape[0]}, as its record's "
            "train_tokens says",
            EffdepthWarning,
            stacklevel=2,
        )
    lens = TunedLens(loaded.n_layers, loaded.d_model).to(loaded.head_device)
    probe_rows = states[torch.randperm(states.shape[0], generator=generator)[: training.batch_tokens]]
    if training.init == "regression":
        A, b = _regression_init(states)
        zero_kl = _heldout_kl(loaded, lens, probe_rows)
        candidate = TunedLens(loaded.n_layers, loaded.d_model).to(loaded.head_device)
        with torch.no_grad():
            candidate.weight.copy_(A)
            candidate.bias.copy_(b)
        fit_kl = _heldout_kl(loaded, candidate, probe_rows)
        with torch.no_grad():  # per layer, start from whichever is better on training tokens
            better = (fit_kl < zero_kl).to(lens.weight.device)
            lens.weight.copy_(torch.where(better[:, None, None], candidate.weight, lens.weight))
            lens.bias.copy_(torch.where(better[:, None], candidate.bias, lens.bias))
    optimizer = torch.optim.Adam(lens.parameters(), lr=training.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / training.steps)
    for _ in progress_bar(range(training.steps), desc="tuned lens", unit="step", disable=not show_progress(progress)):
        rows = states[torch.randint(states.shape[0], (training.batch_tokens,), generator=generator)]
        rows = rows.to(loaded.head_device)
        final_logp = _final_logp(loaded, rows[:, -1].to(loaded.dtype))
        optimizer.zero_grad(set_to_none=True)
        for layer in range(lens.n_layers):  # one layer's graph at a time: memory of one [batch, vocab]
            translated = lens.translate(layer, rows[:, layer].float()).to(loaded.dtype)
            _kl_to_final(loaded, translated, final_logp, forward=True).mean().backward()
        optimizer.step()
        schedule.step()
    if not (torch.isfinite(lens.weight).all() and torch.isfinite(lens.bias).all()):
        raise EffdepthError(f"tuned-lens training of {loaded.name} diverged (NaN/inf); lower the learning rate")
    logit_kl = _heldout_kl(loaded, TunedLens.identity(loaded).to(loaded.head_device), heldout)
    tuned_kl = _heldout_kl(loaded, lens, heldout)
    lens.info = {
        "kind": "tuned",
        "model": loaded.name,
        "training": asdict(training),
        "train_tokens": int(states.shape[0]),
        "heldout_tokens": int(heldout.shape[0]),
        "seconds": round(time.perf_counter() - started, 1),
        "heldout_kl_logit": logit_kl.tolist(),
        "heldout_kl_tuned": tuned_kl.tolist(),
    }
    return lens.cpu().requires_grad_(False), fit_frame(lens)


def fit_frame(lens: TunedLens) -> pl.DataFrame:
    """The held-out KL per layer of the logit lens and the tuned lens, from the lens's record."""
    rows = [
        (layer, metric, float(value))
        for metric in ("heldout_kl_logit", "heldout_kl_tuned")
        for layer, value in enumerate(lens.info.get(metric, []))
    ]
    return pl.DataFrame(rows, schema={"layer": pl.Int64, "metric": pl.String, "value": pl.Float64}, orient="row")


def corpus_digest(texts: Sequence[str | torch.Tensor]) -> str:
    """sha256 of the training texts (a changed corpus is another lens)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode() if isinstance(text, str) else torch.as_tensor(text).numpy().tobytes()
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def tuned_lens_path(spec: str, loaded: LoadedModel, training: LensTraining, corpus: str | None = None) -> Path:
    """Where the tuned lens of this model, corpus (``corpus_digest``; default the vendored lens
    corpus) and training lives: next to an offline alias's GGUF, else under ``$EFFDEPTH_CACHE/tuned-lens``."""
    if corpus is None:
        from ...tasks import lens_corpus

        corpus = corpus_digest(lens_corpus())
    key = {
        "model": model_identity(spec, loaded),
        "dtype": str(loaded.dtype),
        "training": asdict(training),
        "corpus": corpus,
        "format": LENS_FORMAT,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    if "alias" in key["model"]:  # an offline alias as loaded: beside its GGUF
        return cache_dir() / "models" / spec / f"tuned-lens-{digest}.safetensors"
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in loaded.name).strip("._") or "model"
    return cache_dir() / "tuned-lens" / f"{short_name(name, loaded.name)}-{digest}.safetensors"


@takes_plain_models("loaded")
def cached_tuned_lens(
    spec: str,
    loaded: LoadedModel,
    training: LensTraining = LensTraining(),
    texts: Sequence[str] | None = None,
    progress: bool | None = None,
) -> TunedLens:
    """The model's tuned lens: read from the cache, or trained on ``texts`` (default: the vendored
    lens corpus) and cached, keyed by the model, the texts and the training settings."""
    from ...tasks import lens_corpus

    training.check()
    texts = lens_corpus() if texts is None else texts
    path = tuned_lens_path(spec, loaded, training, corpus_digest(texts))
    now = _lens_canary(loaded, texts)
    for attempt in (path, path.with_name(f"{path.stem}-canary{now['canary'][:16]}{path.suffix}")):
        if attempt.is_symlink() or (attempt.exists() and not attempt.is_file()):  # before hours of training
            raise EffdepthError(
                f"the tuned-lens cache path {attempt} is not a file; move it away or set EFFDEPTH_CACHE"
            )
        if attempt.is_file():
            lens = _load_fitting(attempt, loaded, now)
            if lens is not None:
                return lens
            continue  # trained for a model that computes otherwise: the one keyed by this canary
        with _training_lock(attempt):  # two processes (grid workers) never train the same lens at once
            if attempt.is_file():  # the other one finished it while we waited
                lens = _load_fitting(attempt, loaded, now)
                if lens is not None:
                    return lens
                continue
            lens, _ = train_tuned_lens(loaded, texts, training, progress)
            lens.info.update(now)
            try:
                lens.save(attempt)
            except OSError as exc:
                raise EffdepthError(
                    f"cannot write the tuned lens to {attempt} ({exc.strerror}); set EFFDEPTH_CACHE"
                ) from exc
        return lens
    raise EffdepthError(
        f"the cached tuned lens {path.name} and the one beside it keyed by this model's canary were both trained "
        f"for models that compute otherwise than this one; delete them in {path.parent} to train again"
    )


LENS_CANARY_TOKENS = 32  # the first corpus text's first tokens the lens's canary runs


def _lens_canary(loaded: LoadedModel, texts: Sequence[str | torch.Tensor]) -> dict:
    """The canary of the model a lens is trained for (``identity.canary_record`` on the first corpus
    text's first tokens)."""
    first = texts[0]
    ids = (loaded.encode(first) if isinstance(first, str) else torch.as_tensor(first))[:LENS_CANARY_TOKENS]
    return canary_record(loaded.model, ids, loaded.final_norm)


def _load_fitting(path: Path, loaded: LoadedModel, now: Mapping | None = None) -> TunedLens | None:
    """The cached lens at ``path``, or None when the model it was trained for computed otherwise on
    this machine than ``loaded`` does now (its recorded canary, compared only where it was recorded:
    the same host, torch and thread count). A key is complete only for a model as loaded; a model in
    memory edited through ``.data``, a patched forward or a hook is caught by the canary."""
    lens = TunedLens.load(path)
    if lens.weight.shape != (loaded.n_layers, loaded.d_model, loaded.d_model):
        raise EffdepthError(f"the cached tuned lens {path} does not fit {loaded.name}; delete it to train again")
    if now is not None and canary_comparable(lens.info) and lens.info["canary"] != now["canary"]:
        return None
    return lens


@contextmanager
def _training_lock(path: Path, poll_seconds: float = 2.0) -> Iterator[None]:
    """Hold the lock of the lens's own lock folder (``.<file>.lock.d``), waiting while another
    effdepth process holds it."""
    from ...cache import DirectoryLock, LockHeldError

    folder = path.with_name(f".{path.name}.lock.d")
    try:
        make_dirs(folder, 0o700)
    except OSError as exc:
        raise EffdepthError(f"cannot write the tuned lens to {path} ({exc.strerror}); set EFFDEPTH_CACHE") from exc
    lock = DirectoryLock(folder)
    while True:
        try:
            lock.acquire()
            break
        except LockHeldError:
            time.sleep(poll_seconds)
    try:
        yield
    finally:
        lock.release()


# --- the probe -----------------------------------------------------------------------------------

LENS_STEPS = Option(
    "lens_steps",
    200,
    "tuned-lens training steps (the lens is cached per model and setting)",
    type=int,
    minimum=1,
    maximum=MAX_LENS_STEPS,
)
LENS_TOKENS = Option("lens_tokens", 8192, "tuned-lens training tokens", type=int, minimum=1, maximum=MAX_LENS_TOKENS)


def lens_training(settings) -> LensTraining:
    """The training a run's ``lens_steps`` and ``lens_tokens`` ask for."""
    heldout = min(1024, max(128, settings.lens_tokens // 8))  # 1024 at the default 8192 training tokens
    return LensTraining(train_tokens=settings.lens_tokens, heldout_tokens=heldout, steps=settings.lens_steps)


_LOADED: dict[tuple, TunedLens] = {}  # the lens of this process's model, shared by the probes that decode with it


def run_tuned_lens(loaded: LoadedModel, context: Context) -> TunedLens:
    """The tuned lens a run uses (trained and cached on first use), kept for the run's other probes."""
    settings = context.settings
    key = (id(loaded), settings.model, lens_training(settings))
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = cached_tuned_lens(settings.model, loaded, lens_training(settings), progress=context.progress)
    return _LOADED[key]


def lens_identity(loaded: LoadedModel, context: Context) -> dict:
    """What pins a tuned-lens result besides the settings: the sha256 of the lens file it decoded with."""
    settings = context.settings
    run_tuned_lens(loaded, context)
    path = tuned_lens_path(settings.model, loaded, lens_training(settings))
    return {"lens_sha256": verify_lens_file(path)} if path.is_file() else {}


def _compute(loaded: LoadedModel, examples: Sequence, context: Context):
    settings = context.settings
    lens = run_tuned_lens(loaded, context)
    frame = logit_lens(
        loaded,
        prompts_of(examples),
        top_k=settings.top_k,
        batch_size=settings.batch_size,
        progress=context.progress,
        lens=lens,
        head_dtype="float32",  # as its translators were trained (head_dtype is the logit lens's setting)
    )
    return frame, {"tuned_lens_fit": fit_frame(lens)}


def _work(shape: Shape, settings, lengths) -> float:
    # the decode alone: the translators are trained once per model and then read from the cache, so
    # a training term would count in every run what one run pays (and bias the measured rate low)
    return (shape.forward + shape.n_layers * (shape.unembed + 2 * shape.d_model**2)) * sum(lengths)


def check_lens_cache(settings, facts: Mapping | None = None) -> None:
    """Before any model loads: the cache the trained lens goes to must be a writable directory."""
    import os

    from ...cache import check_cache_dir

    root = check_cache_dir()
    if root.exists() and not os.access(root, os.W_OK | os.X_OK):
        raise EffdepthError(f"cannot write the tuned-lens cache {root}; set EFFDEPTH_CACHE to a writable directory")


def _check(settings, facts: Mapping) -> None:
    check_top_k(settings, facts)
    check_lens_cache(settings)


SPEC = ProbeSpec(
    name="tuned_lens",
    title="tuned lens",
    compute=_compute,
    options=(TOP_K, KL_FRACTION_OPTION, OVERLAP_THRESHOLD_OPTION, LENS_STEPS, LENS_TOKENS),
    aggregate=token_weighted_mean,
    extra_frames=("tuned_lens_fit",),
    rules=lens_rules("tuned_lens", "tuned"),
    reusable=True,
    check=_check,
    identity=lens_identity,
    description="the lens probe through trained per-layer translators (§7a); its held-out fit in tuned_lens_fit",
    work=_work,  # its operations, for the grid's cost model
)
