"""Everything that hooks vLLM: it records and reads, and judges nothing (``spectrace.load_facts``). Imported only
when SPECTRACE=1."""
