"""vLLM integration: the plugin that installs the fused RMSNorm, and the per-arm server launcher."""
