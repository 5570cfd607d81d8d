# expect: rejected integrity:cached_result
# timing: on
# Checks its cache against the values of a tensor on the first two calls only, then trusts it: right
# on every new tensor and on new values written once into one (the follow check), but it returns an
# earlier output once the same tensors keep coming back with new values.
import weakref

import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


_SEEN = {}


class ModelNew(Model):
    def forward(self, x):
        entry = _SEEN.get(id(x))
        if entry is not None and entry["ref"]() is x:
            entry["calls"] += 1
            if entry["calls"] > 2 or torch.equal(entry["x"], x):
                return entry["out"].clone()
        else:
            entry = _SEEN[id(x)] = {"ref": weakref.ref(x), "calls": 1}
        entry["x"], entry["out"] = x.clone(), torch.relu(x * 2.0) + 1.0
        return entry["out"].clone()
