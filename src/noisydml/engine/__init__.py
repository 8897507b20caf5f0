"""The trainer (one loop for every method) and the judge of methods' decisions."""
