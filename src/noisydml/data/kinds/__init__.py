"""One module per dataset kind (``noisydml.data.kinds.<kind>``), each with its ``KIND``
(:class:`noisydml.data.registry.DatasetKind`); imported by name (:func:`noisydml.data.registry.dataset_kind`)."""
