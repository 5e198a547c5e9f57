"""effdepth's coverage (tests/data/coverage.csv, written by ``python tests/test_coverage.py``) beside
TransformerLens's: its supported architecture classes mapped to transformers' causal-LM model types.
TransformerLens lives in its own environment (``.compute/peers``, see ``peers.py``)::

    .compute/peers/bin/python benchmarks/transformerlens_coverage.py
"""

import collections
import csv

from transformer_lens.factories import architecture_adapter_factory as f
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

tl = set(f.SUPPORTED_ARCHITECTURES)
ours = {}
lines = open("tests/data/coverage.csv").read().splitlines()
for row in csv.DictReader(lines[1:]):
    ours[row["model_type"]] = row["outcome"]
covered = {
    t
    for t, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
    if any(c in tl for c in ([cls] if isinstance(cls, str) else cls))
}
print(
    "TL architecture classes:",
    len(tl),
    "covering causal-LM types:",
    len(covered),
    "of",
    len(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
)
by = collections.Counter((ours[t], t in covered) for t in ours)
for (o, c), n in sorted(by.items()):
    print(f"{o:16} TL {'yes' if c else 'no '}: {n}")
print("TL yes, effdepth refused:", sorted(t for t in covered if ours.get(t, "").startswith("refused")))
print("TL yes, unbuildable here:", sorted(t for t in covered if ours.get(t) == "unbuildable"))
