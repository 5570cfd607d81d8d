# expect: rejected integrity:reference_modified
# gpu
# problem: big_relu
# writes_reference_outputs.py on a problem whose outputs (256 MiB a trial) the worker keeps on the device.
import gc

import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


class ModelNew(Model):
    def forward(self, x):
        y = torch.zeros_like(x)
        with torch.no_grad():
            for o in gc.get_objects():
                if (isinstance(o, torch.Tensor) and o is not x and o.shape == x.shape and o.dtype == x.dtype
                        and not torch.equal(o.to(x.device), x)):
                    o.copy_(y.to(o.device))
        return y
