"""The tools around the pipeline, none of them a stage's code: the ``noisydml`` command (console), the launcher, the
params check, CI's guard, the paper profiles and their plan and rehearsals, ``-S`` overrides, the params schema
writer, the published face weights' verification. No stage imports them, so editing one re-runs nothing."""
