"""sfjax.compress: compression of trained models.

Pruning masks and the physically pruned model (`prune`), row quantization
(`quant`), and the evolutionary Prune-EA / Quant-EA search with vmapped
fine-tuning (`prune_search`).
"""
