"""Building blocks shared by several methods (pytorch-metric-learning wrappers, PRISM's selector).

Every train stage depends on this folder: put code here only once two methods share it."""
