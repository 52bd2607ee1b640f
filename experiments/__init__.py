"""Stock vs patched A/B experiments: orchestration, goodput statistics, attribution and reports."""
