"""The book's sections, one line each: name → the module that defines its ``SPEC``, in the book's
order (the paper's three questions, then what goes beyond it). Only names: a page's freshness
digest leaves this file out (adding a section stales no page) and counts its own section's module
instead (``freshness.page_code``)."""

BUILTIN = {
    "scale": "effdepth_book.sections.scale",
    "long_cot": "effdepth_book.sections.long_cot",
    "difficulty": "effdepth_book.sections.difficulty",
    "beyond": "effdepth_book.sections.beyond",
}
