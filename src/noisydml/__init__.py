"""noisydml: a reproducible pipeline for noise-robust deep metric learning (see README.md)."""
