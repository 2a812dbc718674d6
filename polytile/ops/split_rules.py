"""How far a default GPU schedule splits a reduction: the most chunks, and the predicted gain a split must
show over the unsplit kernel (the GEMMs' ``gemm_choice`` and the convolutions' ``conv_choice.igemm_choice``)."""

MAX_SPLIT = 16  # the most chunks a split reduction (split-K) is cut into
SPLIT_MARGIN = 0.85  # a split is chosen when predicted at least 15% faster than the best unsplit kernel
