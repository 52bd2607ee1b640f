"""Open-loop trace replayer for OpenAI-compatible streaming completion servers."""
