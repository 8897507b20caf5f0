"""The label audit: which training samples are probably mislabelled, by every method's own decisions and by
detectors that need no method (cleanlab on a run's embeddings, kNN disagreement, a cross-fitted probe's margin),
all in one schema, and judged against the truth where there is one.

Every detector gives, per training sample, the columns of :data:`AUDIT_COLUMNS`: ``score`` (higher = more likely
wrong), ``flagged`` (the detector's own decision at its own threshold; empty where it makes none) and
``suggested_label`` (-1: none, e.g. open-set noise or a detector that only ranks).
"""

AUDIT_COLUMNS = ("sample_id", "given_label", "score", "flagged", "suggested_label")
#: The detectors that need no method, in the order the tables list them: the default set, and every one
#: (``knn_confident_learning``, ``centroid_confident_learning``: confident learning at a benchmark's scale, batched,
#: :mod:`.detectors`; ``open_set``: distance to the nearest class, for images of no training class). Named here, apart from the code that runs them, so that what names them (the study's params
#: check) does not depend on that code.
DETECTORS = ("datalab", "confident_learning", "knn_confident_learning", "centroid_confident_learning",
             "knn_disagreement", "open_set")
DEFAULT_DETECTORS = ("datalab", "confident_learning", "centroid_confident_learning", "knn_disagreement")
