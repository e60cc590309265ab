"""The API layer: wire models, reasons and limits. Imports nothing of ours."""
