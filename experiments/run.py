"""Run the stock-vs-patched (or A/A) goodput experiment:

    python experiments/run.py --trace traces/chat.jsonl

The command line lives in experiments/runner/cli.py (also installed as `rmsnorm-experiment`); this file only
calls it, so the command in the README works from a checkout where the project is installed.
"""

import sys

try:
    from experiments.runner.cli import main
except ModuleNotFoundError as exc:  # the project is not installed in this Python
    sys.exit(f"error: {exc.name} is not importable: run `make setup` (or `pip install -e .`) and use "
             f".venv/bin/python experiments/run.py")

if __name__ == "__main__":
    sys.exit(main())
