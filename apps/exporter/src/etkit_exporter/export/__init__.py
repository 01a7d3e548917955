"""The export pipeline, its quantizer set-up, the backends' lowering, provenance, the demos."""
