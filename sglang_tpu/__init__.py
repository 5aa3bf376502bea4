"""Everything that runs inside a model-server pod and describes one.

The launch contract, the topology catalog, the TPU performance model, the SGLang metric
names, the KV-event schema and the tokenizer live here; the router and the operator import
them and never re-spell them.
"""
