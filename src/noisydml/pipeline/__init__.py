"""What each DVC stage does: one module per stage (``stages/<x>.py`` calls ``noisydml.pipeline.<x>``), and what
stages share (layout, rundata, job). The tools around the pipeline, which no stage imports, are ``noisydml.tools``.

A stage depends on the code unit of its script (``code/stages/<x>.json``, :mod:`.code_digests`): the files it runs,
digested by meaning, so a comment re-runs nothing and a change re-runs exactly the stages that run it.
"""
