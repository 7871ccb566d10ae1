"""Head canary ``ood-record``: an out-of-distribution input record chosen from public information only.

The canary is an input record x_c with every feature +1 or -1 (random signs drawn from the public
seed, over the dataset's public schema: ``n_features``) and a label drawn from the public seed
among the ``n_classes`` classes. A canary user (user level) is G copies of it, so its averaged
gradient is the record's and is clipped jointly to C.

**Privacy contract.** Nothing of the data is read to choose it (not even which features are
zero); its choice is public and recorded in audit.json ``canary_info``. As a record, not a
gradient, every trial trains on it through the release's own sampling and clipping, which a
gradient canary bypasses. Valid because the claim bounds *every* record, outliers included;
strong because its features lie far outside the data's range, so its gradient stays above C and
each time it is sampled it adds the largest contribution clipping allows. Score: the
log-probability of its label under the released head.
"""

from __future__ import annotations

import numpy as np

from ..noise import public_rng
from .head_canaries import HeadCanaryChoice

#: Public tag of the canary's signs and label.
TAG_OOD = 0x00DC


def ood_record(target, data, feats, users) -> HeadCanaryChoice:
    """The ``ood-record`` canary (module docstring): random signs and a random label, public seed."""
    rng = public_rng(target.seed, TAG_OOD)
    x = rng.choice(np.array([-1.0, 1.0]), size=(1, int(data.n_features)))
    label = int(rng.integers(target._n_classes))
    n = 1 if users is None else users
    z = np.repeat(feats.transform(x).astype(np.float64), n, axis=0)
    unit = {} if users is None else {"unit": "user", "records": users}
    info = {"kind": "ood-record", **unit, "label": label, "input": f"random signs in {{-1, +1}}^{int(data.n_features)} (public seed {target.seed})"}
    return HeadCanaryChoice(info, z=z, y=np.full(n, label, dtype=np.int64))
