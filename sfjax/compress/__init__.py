"""sfjax.compress: compression of trained models.

Pruning masks and the physically pruned model (`prune`), quantization and the one
fake-quant (`quant`, also the CNN's), genomes drawn and mutated one way (`genome`,
also the CNN search's), and the evolutionary Prune-EA / Quant-EA search whose
vmapped fine-tune runs the shared train step (`prune_search`).
"""
