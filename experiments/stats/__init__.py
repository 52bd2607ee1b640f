"""Statistics over a run's records: intervals, paired and robust estimates, goodput, the knee, attribution."""
