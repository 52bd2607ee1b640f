"""The names the plugin side and the arms share: the plugin's entry point, its provider, the vLLM IR ops it
implements and the environment variables that steer it (one home, so arms.py and choice.py need not
import each other)."""

PLUGIN_NAME = "rmsnorm_fused"  # the entry-point name in pyproject.toml (integration/plugin.py)
PROVIDER = "cupy_fused"  # the IR-op provider the plugin registers
POLICY_ENV = "RMSNORM_FUSED_POLICY"  # a policy table for every mode (overrides the GPU's tables)
POLICY_ENV_COMPILED = "RMSNORM_FUSED_POLICY_COMPILED"  # a table for the torch.compile path only
PLANTED_NS_ENV = "RMSNORM_PLANTED_NS"  # the planted delay per fused norm call, ns (plantedprovider.py)
IR_OPS = ("rms_norm", "fused_add_rms_norm")  # the vLLM IR ops the provider implements
