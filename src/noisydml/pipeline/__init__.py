"""What each DVC stage does: one module per stage (``stages/<x>.py`` calls ``noisydml.pipeline.<x>``).

A stage module imports only what its stage runs, and dvc.yaml declares exactly
that code as the stage's dependencies (``tests/test_dependencies.py`` checks
the two agree), so editing one stage's code re-runs only that stage.
"""
