# expect: rejected integrity:side_stream_escape
# gpu
# timing: on
# problem: big_relu
# Does the real work on a side stream the timed stream never waits for (the check phase synchronizes the device, so it is correct).
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


_SIDE = None


class ModelNew(Model):
    def forward(self, x):
        global _SIDE
        _SIDE = _SIDE or torch.cuda.Stream()
        y = torch.empty_like(x)
        _SIDE.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(_SIDE):
            for _ in range(20):  # milliseconds of device work, never waited for by the caller's stream
                torch.add(torch.relu(x * 2.0), 1.0, out=y)
        return y
