"""One module per top-level section of params.yaml (``noisydml.sections.<name>``): its schema, its rules and the
helpers that read it, imported by name when a stage loads the section (:data:`noisydml.schema.SECTION_OWNERS`).
A change to one section's schema re-runs the stages that load that section, and no other."""
