#!/bin/bash
# the bundle's last part has arrived: vLLM importable, the kit's wheel installed outside the tree and planning
set -u
R=$(pwd)
{
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
echo "== tracked tree: $(git ls-files -z 2>/dev/null | xargs -0 du -cb 2>/dev/null | tail -1)"
du -sb "$R" | cut -f1 | sed 's/^/== tree on the machine (bytes): /'
python3 -c "import vllm, torch; print('== vllm', vllm.__version__, 'torch', torch.__version__)"
python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/whl . 2>&1 | tail -2
ls -l /tmp/whl
python3 -m pip install -q --no-deps --no-index --target /tmp/kit /tmp/whl/*.whl 2>&1 | tail -2
cd /tmp
export PYTHONPATH=/tmp/kit:${PYTHONPATH:-}
python3 -c "import experiments, runtime_tables; print('== experiments from', experiments.__file__); print('== tables', sorted(p.name for p in runtime_tables.path('.').iterdir())[:40])" 2>&1
python3 -c "from importlib.metadata import entry_points; print('== vllm plugins', [e.value for e in entry_points(group='vllm.general_plugins')])"
echo "== rmsnorm-experiment --dry-run (no flags but the trace)"
/tmp/kit/bin/rmsnorm-experiment --trace "$R/traces/chat.jsonl" --dry-run 2>&1 | head -60
echo "rc=$?"
} > "$OUT/bundle-check.txt" 2>&1
tail -40 "$OUT/bundle-check.txt"
