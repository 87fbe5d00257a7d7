# --- included from _moments.py: a mean and M2 (the sum of squared deviations) gathered chunk by chunk ---


@triton.jit
def _merge_chunk(mean, m2, seen, x, mask, count):
    """(mean, M2, count) of what was seen and the fp32 chunk x (count values where mask holds;
    x is 0 elsewhere), by Chan et al.'s pairwise update: accurate where the mean is large against
    the spread, as a sum of squares is not."""
    chunk_mean = tl.sum(x, axis=0) / count
    centred = tl.where(mask, x - chunk_mean, 0.0)
    delta = chunk_mean - mean
    total = seen + count
    mean += delta * (count / total)
    m2 += tl.sum(centred * centred, axis=0) + delta * delta * (seen * count / total)
    return mean, m2, total


@triton.jit
def _merge_partials(means, m2s, counts):
    """(mean, M2) of parts given as vectors of their means, M2s and counts (a count of 0: no part)."""
    total = tl.sum(counts, axis=0)
    mean = tl.sum(means * counts, axis=0) / total
    delta = means - mean
    return mean, tl.sum(m2s + delta * delta * counts, axis=0)
