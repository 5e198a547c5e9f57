"""Question/answer token splits for the probes that measure the answer (erasure, igrad)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ....errors import EffdepthError
from ....tasks import Example
from ...wrapping import LoadedModel


class AnswerSplit(NamedTuple):
    """A prompt's token ids whose last ``n_answer`` tokens are the answer (unpacks as ``ids, n_answer``)."""

    ids: torch.Tensor  # [token]
    n_answer: int

    @property
    def n_tokens(self) -> int:
        return int(self.ids.numel())

    @property
    def targets(self) -> torch.Tensor:
        """The answer's token ids ``[n_answer]``."""
        return self.ids[self.n_tokens - self.n_answer :]

    @property
    def measured(self) -> slice:
        """The positions whose next-token distributions predict the answer tokens."""
        return slice(self.n_tokens - 1 - self.n_answer, self.n_tokens - 1)

    @property
    def is_answer(self) -> torch.Tensor:
        """Bool ``[token]``: which positions hold answer tokens."""
        return torch.arange(self.n_tokens) >= self.n_tokens - self.n_answer

    def without_last(self) -> torch.Tensor:
        """The ids the answer probes run (by causality the last token predicts nothing measured)."""
        return self.ids[:-1]


AnswerInput = Example | AnswerSplit | tuple[torch.Tensor, int]


def answer_split(loaded: LoadedModel, item: AnswerInput) -> AnswerSplit:
    """Token ids of question + answer and the number A of trailing answer tokens.

    A is the part of the full tokenization past its longest common prefix with the question's
    tokenization (so a token merged across the boundary counts as answer). Tuples ``(ids, A)``
    pass through.
    """
    if isinstance(item, tuple):
        ids, n_answer = torch.as_tensor(item[0], dtype=torch.long).flatten(), int(item[1])
    elif not hasattr(item, "answer"):
        raise EffdepthError(
            f"this probe measures the answer tokens, so a prompt must say where its answer starts: give "
            f"Example(question, answer) or (token ids, number of answer tokens) pairs, not {type(item).__name__}"
        )
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
    return AnswerSplit(ids, n_answer)


def answer_splits(loaded: LoadedModel, items: Sequence[AnswerInput] | AnswerInput) -> list[AnswerSplit]:
    """The split of each item (one ``Example`` or pair is one item)."""
    if hasattr(items, "answer") or (isinstance(items, tuple) and len(items) == 2 and isinstance(items[1], int)):
        items = [items]
    if isinstance(items, str):
        items = [items]  # refused below, in one line
    if len(items) == 0:
        raise EffdepthError("no examples to probe: the task gave 0 examples")
    return [answer_split(loaded, item) for item in items]
