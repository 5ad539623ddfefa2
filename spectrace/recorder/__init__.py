"""Everything that hooks vLLM. Imported only when SPECTRACE=1."""
