"""The labelled-positive mask on 2 gloo ranks, through the production loss (``Contrastive._mask`` gathers
the document keys, ``contrastive_from_embeddings`` gathers the documents): the mean of the two ranks'
losses must equal one process's loss on the whole batch. Rank 0 writes both to OUT.json.

Run under ``torchrun --nproc_per_node=2 labelled_checks.py OUT.json``.
"""

import json
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

from trainer.losses import Contrastive, contrastive_from_embeddings

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(0)
b, n_docs, q_tok, d_tok, dim = 2, 2, 4, 5, 8
queries = torch.nn.functional.normalize(torch.randn(world * b, q_tok, dim, generator=g), dim=-1)
documents = torch.nn.functional.normalize(torch.randn(world * b, n_docs, d_tok, dim, generator=g), dim=-1)
mask = torch.ones(world * b, n_docs, d_tok, dtype=torch.bool)
query_keys = torch.tensor([1, 1, 2, 3])  # rows 0 and 1 share a query; row 3's query labels row 0's positive
document_keys = torch.arange(100, 100 + world * b * n_docs)  # positives at 100, 102, 104, 106
labelled = frozenset({(1, 100), (1, 102), (2, 104), (3, 106), (3, 100)})


def loss(lo: int, hi: int, gather: bool) -> float:
    batch = SimpleNamespace(query_keys=query_keys[lo:hi], document_keys=document_keys[lo * n_docs : hi * n_docs])
    fn = Contrastive(gather=gather, labelled=labelled)
    return float(
        contrastive_from_embeddings(queries[lo:hi], documents[lo:hi], mask[lo:hi], 1.0, gather, fn._mask(batch))
    )


mine = loss(rank * b, (rank + 1) * b, gather=True)
parts = [None] * world
dist.all_gather_object(parts, mine)
if rank == 0:
    whole = loss(0, world * b, gather=False)  # one process, the whole batch, nothing to gather
    unmasked = float(contrastive_from_embeddings(queries, documents, mask, 1.0, False))
    json.dump({"ranks_mean": sum(parts) / world, "one_process": whole, "unmasked": unmasked}, open(sys.argv[1], "w"))
dist.destroy_process_group()
