set -x
C8="--modes compiled --replicas 2 --batch-sizes 1,4,16,32,64 --prefill-sizes 512,2048 --timed-steps 4 --traced-steps 2 --rounds 4 --graph-replays 100"
C1="--model integration/models/llama-3.2-1b --policy kernels/results/policy-h200-in-graph-llama1b.json --modes compiled --replicas 2 --batch-sizes 1,4,16,32,64,128,256 --prefill-sizes 512,2048,8192 --timed-steps 4 --traced-steps 2 --rounds 4 --graph-replays 100"
CN="--modes compiled --replicas 2 --policy kernels/results/policy-h200-in-graph-nopdl.json --batch-sizes 1,4,16,32,64 --prefill-sizes '' --timed-steps 4 --traced-steps 2 --rounds 4 --graph-replays 100"
mkdir -p /tmp/rep/warm
timeout 300 python3 -m kernels.bench --l2 warm --hidden 4096 --out /tmp/rep/warm/h200-warm-l2.json > /tmp/rep/warm/bench.log 2>&1
python3 -m integration.proof.stockcheck --results /tmp/rep/warm/h200-warm-l2.json integration/results/h200-ingraph-all-fused/h200-profile.json integration/results/h200-ingraph-policy/h200-profile.json > /tmp/rep/warm/stockcheck.log 2>&1
timeout 420 python3 -m integration.proof.prove --out /tmp/rep/rep1 $C8 > /tmp/rep/rep1.log 2>&1
timeout 420 python3 -m integration.proof.prove --out /tmp/rep/rep1b1 $C1 > /tmp/rep/rep1b1.log 2>&1
eval timeout 420 python3 -m integration.proof.prove --out /tmp/rep/nopdl $CN > /tmp/rep/nopdl.log 2>&1
timeout 420 python3 -m integration.proof.prove --out /tmp/rep/rep2 $C8 > /tmp/rep/rep2.log 2>&1
timeout 420 python3 -m integration.proof.prove --out /tmp/rep/rep1b2 $C1 > /tmp/rep/rep1b2.log 2>&1
timeout 420 python3 -m integration.proof.prove --out /tmp/rep/rep3 $C8 > /tmp/rep/rep3.log 2>&1
