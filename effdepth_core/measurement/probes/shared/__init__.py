"""What the probes share and are not probes themselves: the activation batch loop, the lens, the
answer split, reductions of per-example frames, output changes, depth scores, the correlational
probes' ED shortcut. A probe is a module of ``probes/`` with a ``SPEC`` (``probes/spec.py``)."""
