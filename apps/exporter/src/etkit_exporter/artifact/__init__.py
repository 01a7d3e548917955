"""The export folder: staging and the manifest, the IO table, the ETRecord, the float-op report,
report.json and report.md."""
