"""One module per numbered stage (``s00_data`` ... ``s07_figures``): each owns its run directory (the only callers of
``runio.start_run`` / ``finish_run``) and composes the method library below it; ``pipeline.run_stage`` dispatches to
them and report code reads what they wrote."""
