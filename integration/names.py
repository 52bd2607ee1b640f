"""The names the plugin side, the arms and the run share: the plugin's entry point, its provider, the vLLM
IR ops it implements, the environment variables that steer it, their two policy values (every call
fused or declined) and the GPU's table names (one home, so arms.py, choice.py and experiments/ need not
import each other for them)."""

PLUGIN_NAME = "rmsnorm_fused"  # the entry-point name in pyproject.toml (integration/plugin.py)
PROVIDER = "cupy_fused"  # the IR-op provider the plugin registers
POLICY_ENV = "RMSNORM_FUSED_POLICY"  # a policy table for every mode (overrides the GPU's tables)
POLICY_ENV_COMPILED = "RMSNORM_FUSED_POLICY_COMPILED"  # a table for the torch.compile path only
PLANTED_NS_ENV = "RMSNORM_PLANTED_NS"  # the planted delay per fused norm call, ns (plantedprovider.py)
IR_OPS = ("rms_norm", "fused_add_rms_norm")  # the vLLM IR ops the provider implements

ALL_FUSED = "all"  # as either variable's value: every call fused at the kernel's own launch shape
NONE_FUSED = "none"  # as either variable's value: every call declined (stock), the plugin idle
# Tables built by integration/proof/ingraph.py from timings inside vLLM, per GPU, beside the kernel
# results: under torch.compile stock is Inductor's kernel inside vLLM's graph; in eager mode vLLM's
# CUDA kernel, where the host cost of each call counts too.
TABLES = {"compiled": "policy-{gpu}-in-graph.json", "eager": "policy-{gpu}-in-vllm-eager.json"}
MAKE_TABLES = ("python -m kernels.suite --out OUT/{gpu}.json, then "
               "python -m integration.proof.prove --all-fused and python -m integration.proof.ingraph "
               "--out runtime_tables/policy-{gpu}-in-graph.json (integration/README.md, 'Policy')")
