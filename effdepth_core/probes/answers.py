"""Question/answer token splits for the probes that measure the answer (erasure, igrad)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import EffdepthError
from ..models import LoadedModel
from ..tasks import Example

AnswerInput = Example | tuple[torch.Tensor, int]


def answer_split(loaded: LoadedModel, item: AnswerInput) -> tuple[torch.Tensor, int]:
    """Token ids of question + answer and the number A of trailing answer tokens.

    A is the part of the full tokenization past its longest common prefix with the question's
    tokenization (so a token merged across the boundary counts as answer). Tuples ``(ids, A)``
    pass through.
    """
    if isinstance(item, tuple):
        ids, n_answer = torch.as_tensor(item[0], dtype=torch.long).flatten(), int(item[1])
    else:
        if not item.answer:
            raise EffdepthError(
                "this probe needs examples with an answer (question/answer split); the task has none — "
                "use gsm8k, aime24, math, hellaswag, addition, multiplication, or a .jsonl with 'answer'"
            )
        ids = loaded.encode(item.prompt)
        question = loaded.encode(item.question)
        common = 0
        for a, b in zip(ids.tolist(), question.tolist(), strict=False):
            if a != b:
                break
            common += 1
        n_answer = ids.numel() - common
    if not 1 <= n_answer < ids.numel():
        raise EffdepthError(f"an example has {n_answer} answer tokens out of {ids.numel()}; need 1..{ids.numel() - 1}")
    if loaded.max_positions and ids.numel() > loaded.max_positions:
        raise EffdepthError(
            f"an example has {ids.numel()} tokens; model {loaded.name!r} takes at most {loaded.max_positions}"
        )
    return ids, n_answer


def answer_splits(loaded: LoadedModel, items: Sequence[AnswerInput]) -> list[tuple[torch.Tensor, int]]:
    if len(items) == 0:
        raise EffdepthError("no examples to probe: the task gave 0 examples")
    return [answer_split(loaded, item) for item in items]
