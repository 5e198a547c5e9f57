"""The reproduction book's layer: study grids, Altair charts, the paper's Table 1, the papermill
runner and the Sphinx extension. Needs the ``[book]`` extra; the measurement core never imports it."""

import warnings

# a kernel without ipywidgets: tqdm falls back to text bars, and says so on every page's stderr
warnings.filterwarnings("ignore", message="IProgress not found")
