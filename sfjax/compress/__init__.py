"""sfjax.compress: compression of trained models.

Pruning masks and the physically pruned model (`prune`), quantization and the one
fake-quant (`quant`, also the CNN's), genomes drawn and mutated one way (`genome`,
also the CNN search's), and the evolutionary Prune-EA / Quant-EA search whose
vmapped fine-tune runs the shared train step (`prune_search`).
"""

from sfjax.compress.genome import GenomeLayout, mutate_genome, random_unit_bits
from sfjax.compress.prune import PrunedModel, PruneSpec, make_spec, pruned_size
from sfjax.compress.prune_search import load_data, search
from sfjax.compress.quant import fake_quant

__all__ = ["GenomeLayout", "PruneSpec", "PrunedModel", "fake_quant", "load_data", "make_spec",
           "mutate_genome", "pruned_size", "random_unit_bits", "search"]
