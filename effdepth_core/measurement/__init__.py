"""The measurement layer: what a model computes and how deep it really is — adapters and the
load-time checks, a model's identity, reading (trace) and changing (replay) activations, the probes
and their registry, the depth statistics and the tasks. It imports only the foundation below it
(errors, paths, options, terminal, the cache files) — never the run store, the command line,
acquisition or the book (``tests/test_layout.py``)."""
