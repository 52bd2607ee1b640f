"""A run's data: SLO tiers, the window schedule, a run directory's files."""
