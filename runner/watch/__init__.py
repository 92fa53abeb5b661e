"""While the run goes: memory, stalls, threads under contention, progress, rates, the timeline."""
