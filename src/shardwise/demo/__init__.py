"""``shardwise demo``: the whole system end to end, on a small data set written for it."""
