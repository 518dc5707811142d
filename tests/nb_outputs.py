"""Reading the executed tiny notebooks (the ``tiny_pipeline`` fixture) in the notebook-step tests: one code cell by
a marker in its source, its stdout, its rich outputs of one MIME type."""


def executed(tiny_pipeline, stage: str):
    import nbformat
    return nbformat.read(tiny_pipeline["executed"][stage], as_version=4)


def code_cell(nb, marker: str):
    """The one code cell whose source contains ``marker``."""
    cells = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    assert len(cells) == 1, (marker, len(cells))
    return cells[0]


def stdout_of(nb, marker: str) -> str:
    return "".join(o.get("text", "") for o in code_cell(nb, marker).get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def data_of(nb, marker: str, mime: str) -> list[str]:
    return [o["data"][mime] for o in code_cell(nb, marker).get("outputs", []) if mime in o.get("data", {})]
