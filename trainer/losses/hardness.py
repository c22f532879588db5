"""How hard a batch's negatives still are: what the loss curve alone does not tell the user.

Negatives mined by the base model can be trivial thirty steps later (on NFCorpus the loss fell from 0.85 to
about 0.1 and the batches carried almost no signal). Two figures say so directly, per logged step:

* **margin**: the positive's score minus the best-scoring other document of its row (mined or in-batch),
  averaged over rows; it grows as the negatives go stale;
* **easy share**: the share of rows whose loss is near zero (below :data:`EASY_LOSS`, the positive holding
  over 95% of its row's softmax): such a row teaches almost nothing.

Computed from the logits the loss already has, without a gradient and without a host sync: the sums stay on
the device until a log step reads them (``train.py``).
"""

from __future__ import annotations

import math

import torch

__all__ = ["EASY_LOSS", "STALE_SHARE", "hardness_sums", "summarize"]

EASY_LOSS = -math.log(0.95)  # about 0.051: the positive takes over 95% of the softmax
STALE_SHARE = 0.5  # above this share of easy rows the log says the negatives have gone stale


@torch.no_grad()
def hardness_sums(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """(sum of margins, easy rows, rows) of one micro-batch, float64 on the device.

    >>> logits = torch.tensor([[5.0, 1.0, 0.0], [0.0, 2.0, 1.0]])  # row 0 easy, row 1's positive beaten
    >>> hardness_sums(logits, torch.tensor([0, 0]), temperature=1.0).tolist()
    [2.0, 1.0, 2.0]
    """
    logits = logits.float()
    positive = logits.gather(1, labels[:, None]).squeeze(1)
    others = logits.scatter(1, labels[:, None], float("-inf")).max(1).values
    margin = ((positive - others) * temperature).nan_to_num(0.0, posinf=0.0, neginf=0.0)
    easy = torch.nn.functional.cross_entropy(logits, labels, reduction="none") < EASY_LOSS
    return torch.stack([margin.sum(), easy.sum(), torch.tensor(float(len(labels)), device=logits.device)]).double()


def summarize(sums: list[float]) -> dict[str, float]:
    """Sums (margins, easy rows, rows) -> the logged figures.

    >>> summarize([12.0, 3.0, 4.0])
    {'margin': 3.0, 'easy_share': 0.75}
    """
    margins, easy, rows = sums
    return {"margin": margins / rows, "easy_share": easy / rows} if rows else {}
