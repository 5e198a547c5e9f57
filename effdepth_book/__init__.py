"""The reproduction book's layer: study grids, Altair charts, the paper's Table 1, the papermill
runner and the Sphinx extension. Needs the ``[book]`` extra. The measurement core never imports it
at module level: only ``effdepth book``, ``grid``, ``plot`` and ``measure(...).plot()`` load it,
inside their functions (``tests/test_layout.py``)."""

import warnings

# a kernel without ipywidgets: tqdm falls back to text bars, and says so on every page's stderr
warnings.filterwarnings("ignore", message="IProgress not found")
