"""Error feedback (1-bit SGD, Seide et al. 2014): carry each step's coding error into the next.

The residual-memory scheme used with 1-bit SGD and by DeepSpeed's 1-bit Adam / GRACE
(ANCHORS.md): before encoding tensor `key`, add what the codec lost the last time that
key was sent; after encoding, remember the new loss. Over steps the receiver sees the
full signal, only delayed. The residuals are plain tensors keyed by name, so they can be
checkpointed (`state_dict`) and survive bucket rebuilds when keys name parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from approxdist.comm.codecs.base import Codec, Payload
from approxdist.errors import CodecError


class ErrorFeedback:
    """Residual memory around one codec: `encode(key, x)` sends x + residual[key].

    A key seen with a new shape, dtype or device starts again from a zero residual.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.residuals: dict[str, torch.Tensor] = {}

    def encode(self, key: str, x: torch.Tensor) -> tuple[Payload, torch.Tensor]:
        """Encode x plus the residual of `key`; return the payload and what the receiver decodes.

        The residual becomes (x + old residual) - decoded.
        """
        corrected = x.detach().float()
        residual = self._residual(key, corrected)
        if residual is not None:
            corrected = corrected + residual
        payload = self.codec.encode(corrected)
        decoded = self.codec.roundtrip(corrected)  # = decode(payload), cheaper for most codecs
        new = corrected - decoded  # non-finite errors are not carried forward
        self.residuals[key] = torch.nan_to_num_(new, nan=0.0, posinf=0.0, neginf=0.0)
        return payload, decoded

    def _residual(self, key: str, like: torch.Tensor) -> torch.Tensor | None:
        old = self.residuals.get(key)
        if old is None or old.shape != like.shape or old.device != like.device:
            return None
        return old

    def residual_norm(self) -> float:
        """L2 norm of all residuals together (0.0 when empty)."""
        total = sum(float(r.double().pow(2).sum()) for r in self.residuals.values())
        return total ** 0.5

    def reset(self, key: str | None = None) -> None:
        """Forget the residual of `key`, or all residuals."""
        if key is None:
            self.residuals.clear()
        else:
            self.residuals.pop(key, None)

    def state_dict(self) -> dict[str, object]:
        return {"codec": self.codec.spec,
                "residuals": {k: v.detach().clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore residuals saved by `state_dict`; the codec spec must match."""
        spec = state.get("codec")
        if spec != self.codec.spec:
            raise CodecError(f"error-feedback state was saved for codec {spec!r}, not "
                             f"{self.codec.spec!r}; load it into ErrorFeedback of {spec!r}")
        residuals = state.get("residuals")
        if not isinstance(residuals, Mapping):
            raise CodecError("error-feedback state has no 'residuals' mapping; "
                             "pass the dict returned by ErrorFeedback.state_dict()")
        self.residuals = {str(k): torch.as_tensor(v).float().clone() for k, v in residuals.items()}
