"""callproof: an auditable, receipt-producing gateway for LLM tool calling."""

__version__ = "0.1.0"
