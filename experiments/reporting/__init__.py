"""The report of a run: report.json, report.md, plots, and the A/A noise floor over committed reports."""
