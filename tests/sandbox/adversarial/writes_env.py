# expect: correct
# Writes its environment to a file named by CONFIG; the test checks it holds no credentials.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


import json
import os

CONFIG = {'OUT': ''}


class ModelNew(Model):
    def forward(self, x):
        if CONFIG['OUT']:
            with open('/proc/self/environ', 'rb') as f:
                raw = f.read().decode('utf-8', 'replace')
            with open(CONFIG['OUT'], 'w') as f:
                json.dump({'environ': dict(os.environ), 'proc': raw, 'cwd': os.getcwd()}, f)
        return torch.relu(x * 2.0) + 1.0
