"""What each section of the book measures, from a page's parameters: the studies (models × task
specs) its notebook runs. The notebooks and ``effdepth grid`` both read these, so the grid computes
exactly the runs the pages then render from the cache."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .study import difficulty_specs

# page parameters that every run of a page shares (the rest describe the studies)
SHARED = ("seed", "device", "dtype")


@dataclass(frozen=True)
class StudyPlan:
    """One study of a page: ``specs`` on each of ``models`` (``specs_by_model`` overrides per model)."""

    name: str  # "tasks", "causal", "levels", "skip"
    models: tuple[str, ...]
    specs: tuple[dict, ...]
    specs_by_model: dict = field(default_factory=dict)
    download: bool = True


def defaults(parameters: Mapping) -> dict:
    """The settings every run of a page shares (plus its precision rule, when the profile sets one)."""
    shared = {k: parameters[k] for k in SHARED if k in parameters}
    if parameters.get("precision") is not None:
        shared["precision"] = parameters["precision"]
    return shared


def _models(parameters: Mapping) -> tuple[str, ...]:
    return tuple(parameters.get("models") or ())


def plans(section: str, parameters: Mapping) -> list[StudyPlan]:
    """The studies of one page of ``section`` (its parameter set's resolved ``parameters``)."""
    models = _models(parameters)
    tasks = tuple(parameters.get("tasks") or ())
    if section == "scale":
        causal = parameters.get("causal")
        return [
            StudyPlan("tasks", models, tasks, dict(parameters.get("tasks_by_model") or {})),
            *(
                [StudyPlan("causal", models, (dict(causal),), dict(parameters.get("causal_by_model") or {}))]
                if causal
                else []
            ),
        ]
    if section == "difficulty":
        precise = parameters.get("precision") is not None
        levels = difficulty_specs(parameters.get("math"), parameters.get("arithmetic"), parameters.get("skip"), precise)
        level_models = tuple(parameters.get("level_models") or models)
        extra = tuple(parameters.get("sensitivity_tasks") or ())
        # the sensitivity tasks run for sensitivity_models (default: every model of the page)
        by_model = {m: (*tasks, *extra) for m in parameters.get("sensitivity_models") or models} if extra else {}
        return [StudyPlan("tasks", models, tasks, by_model), StudyPlan("levels", level_models, tuple(levels))]
    if section == "long_cot":
        pairs = parameters.get("pairs") or []
        pair_models = tuple(dict.fromkeys(m for pair in pairs for m in (pair["base"], pair["long_cot"])))
        return [StudyPlan("tasks", pair_models, tasks, download=bool(parameters.get("download", True)))]
    if section == "beyond":
        return [StudyPlan("tasks", models, tasks)]
    raise ValueError(f"unknown section {section!r}")
