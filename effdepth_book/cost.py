"""What a run costs before it starts: each probe's operations (``ProbeSpec.work``: prompt tokens ×
layers × vocabulary × the probe's settings) times a rate measured on this code — seconds per
operation of that probe on that model, the median over the runs already cached. A model or probe
without a measurement borrows the rate of the nearest measured model (by parameters), then of any
probe. GPU hours use the rates ``benchmarks/paper_scale.py`` measured on an NVIDIA H200 in
bfloat16 (``GPU_RATES``, the nearest measured model size by parameters); a probe it did not
measure (pruning, early exit, the tuned lens, the map) takes ``GPU_OPS_PER_SECOND``.

Prompt tokens are estimated as characters / ``CHARS_PER_TOKEN`` both when calibrating and when
estimating, so a tokenizer's real ratio enters the measured rate, not the error."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from effdepth_core.measurement import registry
from effdepth_core.measurement.probes.spec import Shape
from effdepth_core.rundir import EXAMPLES, METADATA, read_metadata
from effdepth_core.settings import RunSettings

CHARS_PER_TOKEN = 4.0
# Seconds per operation (``ProbeSpec.work``) of each probe on one NVIDIA H200 in bfloat16, by model
# size in parameters: ``benchmarks/paper_scale.py --device cuda`` on random-weight copies of
# smollm2-135m's and Qwen2.5-1.5B/7B/14B/32B's configurations (benchmarks/output/paper_scale-h200.txt
# and paper_scale-large-h200.txt; tests/test_grid.py recomputes this table from those files).
# Small models are launch-bound: their rate per operation is ~10-100x the large ones'. Each is one
# timing printed to 2 decimals (a 0.04 s cosine is ±12 %), and integrated gradients' is Riemann-256's
# (the default adaptive rule refines 8 evaluations per round: slower per operation on a GPU).
GPU_RATES: dict[str, tuple[tuple[int, float], ...]] = {
    "cosine": ((134515008, 1.239e-13), (1543714304, 1.080e-14), (7615616512, 2.188e-15),
               (14770033664, 2.539e-15), (32763876352, 2.162e-15)),
    "logit_lens": ((134515008, 4.235e-14), (1543714304, 1.135e-14), (7615616512, 5.100e-15),
                   (14770033664, 4.155e-15), (32763876352, 4.036e-15)),
    "skip": ((134515008, 2.478e-13), (1543714304, 2.532e-14), (7615616512, 8.452e-15),
             (14770033664, 5.343e-15), (32763876352, 3.788e-15)),
    "erasure": ((134515008, 5.012e-13), (1543714304, 3.354e-14), (7615616512, 7.165e-15),
                (14770033664, 4.702e-15), (32763876352, 2.989e-15)),
    "igrad": ((134515008, 1.022e-14), (1543714304, 2.416e-15), (7615616512, 2.084e-15),
              (14770033664, 2.231e-15), (32763876352, 2.430e-15)),
}  # fmt: skip
# For the probes paper_scale.py does not time: an assumption, the operations per second a probe
# sustains on one data-centre GPU in bfloat16 (~15% of an H100's dense peak).
GPU_OPS_PER_SECOND = 1.5e14


def gpu_rate(probe: str, n_params: int) -> tuple[float, bool]:
    """Seconds per operation of ``probe`` on one H200 for a model of ``n_params`` parameters (the
    nearest measured size), and whether it was measured (else ``1 / GPU_OPS_PER_SECOND``)."""
    measured = GPU_RATES.get(probe)
    if not measured:
        return 1 / GPU_OPS_PER_SECOND, False
    return min(measured, key=lambda entry: abs(math.log(entry[0] / n_params)))[1], True


def token_lengths(texts: Iterable[str]) -> list[int]:
    return [max(1, math.ceil(len(t) / CHARS_PER_TOKEN)) for t in texts]


def example_texts(path: Path) -> list[str]:
    """Each cached example's probed text (prompt, and its answer where split)."""
    from effdepth_core.cache import read_regular

    lines = read_regular(path, 1 << 30, "examples file").decode("utf-8").splitlines()
    return [str(json.loads(line).get("prompt") or "") for line in lines if line.strip()]


@dataclass(frozen=True)
class Measurement:
    model: str
    probe: str
    seconds: float
    work: float
    n_params: int
    shared: bool = False  # its share of one forward pass with other probes (seconds split by work)

    @property
    def rate(self) -> float:
        return self.seconds / self.work


def shape_from(metadata: dict) -> Shape | None:
    facts = [metadata.get(k) for k in ("n_layers", "d_model", "vocab_size", "n_params")]
    if all(isinstance(v, int) and v > 0 for v in facts):
        return Shape(*facts)
    return None


def _settings(metadata: dict) -> RunSettings | None:
    values = dict(metadata.get("settings") or {})
    try:
        return RunSettings.recorded(values)
    except (KeyError, TypeError, ValueError):
        return None


def run_directories(roots: Sequence[Path]) -> list[Path]:
    """Every directory under ``roots`` holding an effdepth metadata.json."""
    found = []
    for root in roots:
        if root.is_dir():
            found += sorted(p.parent for p in root.rglob(METADATA))
    return found


@dataclass
class Calibration:
    """The measured rates and the model shapes seen in the cache."""

    measurements: list[Measurement] = field(default_factory=list)
    shapes: dict[str, Shape] = field(default_factory=dict)

    @classmethod
    def from_cache(cls, roots: Sequence[Path]) -> Calibration:
        calibration = cls()
        vocab: dict[str, int] = {}
        pending = []
        for folder in run_directories(roots):
            metadata = read_metadata(folder, skip_newer=True)
            if metadata is None or not (folder / EXAMPLES).is_file():
                continue
            settings = _settings(metadata)
            if settings is None:
                continue
            if isinstance(metadata.get("vocab_size"), int) and metadata["vocab_size"] > 0:
                vocab[settings.model] = metadata["vocab_size"]
            pending.append((folder, metadata, settings))
        for folder, metadata, settings in pending:
            shape = shape_from({**metadata, "vocab_size": metadata.get("vocab_size") or vocab.get(settings.model)})
            shape = shape or _known_shape(settings.model)  # metadata of early versions lack d_model, vocab_size
            if shape is None:
                continue
            calibration.shapes.setdefault(settings.model, shape)
            try:
                lengths = token_lengths(example_texts(folder / EXAMPLES))
            except (OSError, ValueError):
                continue
            if not str(metadata.get("device", "cpu")).startswith("cpu"):
                continue  # CPU hours from CPU runs only (no GPU rate is measured yet)
            for probe, record in metadata.get("probes", {}).items():
                seconds = record.get("seconds")
                if probe not in registry.names() or not isinstance(seconds, int | float) or seconds <= 0:
                    continue
                reused = int((record.get("reused") or {}).get("examples", 0))
                computed = lengths[reused:]
                if not computed:
                    continue
                work = registry.get(probe).work(shape, settings, computed)
                shared = bool(record.get("shared_pass"))
                measured = Measurement(settings.model, probe, seconds, work, shape.n_params, shared)
                calibration.measurements.append(measured)
        return calibration

    def rate(self, model: str, probe: str, n_params: int) -> tuple[float | None, str]:
        """Seconds per operation of ``probe`` on ``model``, and where it comes from."""
        # a probe's own runs first; its share of a pass shared with other probes (the pass's rate) where none
        mine = [m for m in self.measurements if m.model == model and m.probe == probe]
        own = [m.rate for m in mine if not m.shared] or [m.rate for m in mine]
        if own:
            return statistics.median(own), "measured"
        same_probe = [m for m in self.measurements if m.probe == probe]
        if same_probe:
            nearest = min(same_probe, key=lambda m: abs(math.log(m.n_params / n_params)))
            rates = [m.rate for m in same_probe if m.model == nearest.model]
            return statistics.median(rates), f"from {nearest.model}"
        if self.measurements:
            return statistics.median(m.rate for m in self.measurements), "from all probes"
        return None, "no measurement"


def _known_shape(model: str) -> Shape | None:
    """An offline alias's shape from the zoo table; a hub model's from its config when the hub
    cache holds it (the parameter count then from the config's sizes)."""
    from effdepth_core.zoo import ZOO

    entry = ZOO.get(model)
    if entry is not None and entry.n_layers and entry.d_model and entry.vocab_size and entry.n_params:
        return Shape(entry.n_layers, entry.d_model, entry.vocab_size, entry.n_params)
    return _config_shape(model)


@cache
def _config_shape(model: str) -> Shape | None:
    """From a local model folder's config.json, or a hub model's in the hub cache (no download)."""
    folder = Path(model).expanduser()
    path = folder / "config.json" if folder.is_dir() else None
    if path is None and "/" in model and not folder.exists():
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(model, "config.json")
            path = Path(found) if isinstance(found, str) else None
        except Exception:  # no hub library or an odd id: unknown
            path = None
    try:
        from effdepth_core.cache import read_json

        config = read_json(path) if path is not None else None
        config = config.get("text_config", config) if config else None
        layers, width, vocab = config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
        heads = config["num_attention_heads"]
        kv = config.get("num_key_value_heads") or heads
        inner = config.get("intermediate_size") or 4 * width
    except (OSError, ValueError, KeyError, TypeError):  # not cached here, or not a causal LM config
        return None
    attention = width * width * (2 + 2 * kv / heads)
    tied = config.get("tie_word_embeddings", True)
    n_params = layers * (attention + 3 * width * inner) + vocab * width * (1 if tied else 2)
    return Shape(layers, width, vocab, int(n_params))


def shape_of(model: str, calibration: Calibration) -> Shape | None:
    return calibration.shapes.get(model) or _known_shape(model)


@dataclass(frozen=True)
class Estimate:
    """One run's estimated CPU seconds (None: unknown) and GPU seconds, and how it was reached."""

    cpu_seconds: float | None
    gpu_seconds: float | None
    source: str

    def __add__(self, other: Estimate) -> Estimate:
        cpu = None if self.cpu_seconds is None or other.cpu_seconds is None else self.cpu_seconds + other.cpu_seconds
        gpu = None if self.gpu_seconds is None or other.gpu_seconds is None else self.gpu_seconds + other.gpu_seconds
        sources = sorted({*self.source.split("; "), *other.source.split("; ")} - {""})
        return Estimate(cpu, gpu, "; ".join(sources))


NOTHING = Estimate(0.0, 0.0, "")


def estimate(
    settings: RunSettings, probes: Sequence[str], lengths: Sequence[int], calibration: Calibration
) -> Estimate:
    """The cost of running ``probes`` on prompts of ``lengths`` tokens."""
    shape = shape_of(settings.model, calibration)
    if shape is None:
        return Estimate(None, None, f"{settings.model}: shape unknown until it runs once")
    total = NOTHING
    for probe in probes:
        work = registry.get(probe).work(shape, settings, lengths)
        rate, source = calibration.rate(settings.model, probe, shape.n_params)
        total = total + Estimate(
            None if rate is None else work * rate, work * gpu_rate(probe, shape.n_params)[0], source
        )
    return total


@cache
def _task_texts(
    task: str, n: int, seed: int, level: int | None, digits: int, max_tokens: int | None
) -> tuple[str, ...]:
    from effdepth_core.task_loading import load_task

    def tokens(text: str) -> int:  # the same estimate as everywhere here (aime24 drops prompts > 400 tokens)
        return token_lengths([text])[0]

    examples = load_task(task, n=n, seed=seed, level=level, digits=digits, count_tokens=tokens, max_tokens=max_tokens)
    return tuple(e.prompt for e in examples)


def task_lengths(settings: RunSettings, n: int | None = None) -> list[int]:
    """The estimated token lengths of the run's first ``n`` prompts (no tokenizer is loaded); with
    ``positions``, each cut to it (the texts estimated shorter are left out, as the run leaves them)."""
    from effdepth_core.errors import TaskError

    try:
        texts = _task_texts(
            settings.task, n or settings.n, settings.seed, settings.level, settings.digits, settings.max_tokens
        )
    except TaskError:  # more than the data set has: all of it (the run stops there too)
        from effdepth_core.task_loading import task_pool

        texts = tuple(e.prompt for e in task_pool(settings.task, level=settings.level))
    lengths = token_lengths(texts)
    if settings.positions is not None:
        return [settings.positions for length in lengths if length >= settings.positions]
    return lengths


__all__ = [
    "GPU_OPS_PER_SECOND",
    "GPU_RATES",
    "NOTHING",
    "Calibration",
    "Estimate",
    "estimate",
    "gpu_rate",
    "shape_of",
    "task_lengths",
]
