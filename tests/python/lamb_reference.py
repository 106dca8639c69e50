"""numpy reference of LAMB (docs/optimizers/lamb.md): 1-bit LAMB's warmup
update at every step (OneBitLambReference._warmup's trust ratio and fp32
operations), with the bias correction of math/onebit_adam.hpp when the
config asks for it (the default): u = m * scale / (sqrt(v) * rbc2 + eps)
+ wd * p, both factors from the parameter's own update count."""

import numpy as np

from onebit_lamb_reference import OneBitLambReference, warmup_coeff
from onebit_reference import F32, bias_consts, denominator, fma32, sum_squares


class LambReference(OneBitLambReference):
    def __init__(self, config: dict, params, world: int, **kw):
        super().__init__(config, params, world, **kw)
        p = config["optimizer"].get("params", {})
        self.bias_correction = bool(p.get("bias_correction", True))
        self.freeze_step = float("inf")  # never compresses

    def _warmup(self, averaged, mul):
        t = self.updates + 1
        for i in range(len(self.master)):
            c = self._consts(i)
            g = (averaged[i] * mul).astype(np.float32)
            self.m[i] = self._momentum(self.m[i], g, c)
            self.v[i] = self._variance(self.v[i], g, c)
            b = bias_consts(c["beta1"], c["beta2"], t, t, self.bias_correction)
            b["eps"] = c["eps"]
            u = ((self.m[i] * b["scale"]).astype(np.float32) / denominator(self.v[i], b)).astype(np.float32)
            if c["wd"] > 0:
                u = fma32(c["wd"], self.master[i], u)
            self._apply(i, warmup_coeff(sum_squares(self.master[i]), sum_squares(u), self.k), u)
