"""Per-row statistics of decoded images (the ``image`` kind's ``stats``), for input drift.

Per channel the mean and standard deviation of the normalised pixels, the brightness (Rec. 601
luma of the de-normalised channel means, colour images only: a grey image's is its mean) and
the largest value; then statistics of the image's layout, on the channels' average, that a 90
degree rotation moves and a re-encoding does not:

- ``gradient_ratio``: log of horizontal over vertical gradient energy (strokes turned across);
- ``centre_x``, ``centre_y``: the centre of mass (the image minus its darkest value), -0.5..0.5;
- ``spread_ratio``: log of the vertical over the horizontal variance of that mass (a tall
  digit becomes a wide one);
- ``top_bottom``, ``left_right``: the mass in the top (left) half minus the bottom (right)
  half, as a share of it.

Measured on the digits demo (docs/cascade.md, "Input drift"): rotated 90 degrees, ``centre_y``
moves 3.4 calibration standard deviations, ``spread_ratio`` 2.0, ``top_bottom`` 1.4; the same
images re-encoded as JPEG (quality 75) move nothing more than 0.3.
"""

from __future__ import annotations

import numpy as np

from serving.release.manifest import ImageInput

EPS = 1e-6  # keeps the log ratios finite on a blank image (0 then, not a spike)
LUMA = np.array([0.299, 0.587, 0.114])
LAYOUT = ["max", "gradient_ratio", "centre_x", "centre_y", "spread_ratio", "top_bottom",
          "left_right"]


def _axis(n: int) -> np.ndarray:
    """``[n, 3]``: each pixel's position (-0.5..0.5, pixel centres), its square, and +1 in the
    first half, -1 in the second (0 on an odd side's middle line)."""
    position = (np.arange(n) + 0.5) / n - 0.5
    return np.stack([position, position ** 2, -np.sign(position)], axis=1)


class PixelStats:
    """The statistics of one release's images (its channels, size, layout, normalisation)."""

    def __init__(self, spec: ImageInput) -> None:
        c = spec.channels
        self.channels, self.nhwc = c, spec.layout == "NHWC"
        self.names = ([f"mean_c{i}" for i in range(c)] + [f"std_c{i}" for i in range(c)]
                      + (["brightness"] if c == 3 else []) + LAYOUT)
        self._y, self._x = _axis(spec.height), _axis(spec.width)
        # a normalised value v is the pixel (v * std + mean) * scale: luma on the 0..1 scale
        std = np.asarray(spec.std or [1.0] * c, float)
        mean = np.asarray(spec.mean or [0.0] * c, float)
        self._luma = (LUMA * std, float(LUMA @ mean)) if c == 3 else None

    def __call__(self, rows: list[np.ndarray]) -> np.ndarray:
        # few numpy calls on the whole request: each costs microseconds, a 28x28 row's work less
        x = np.stack(rows)
        if self.nhwc:
            x = x.transpose(0, 3, 1, 2)
        n, c, h, w = x.shape
        out = np.empty((n, len(self.names)))
        flat = x.reshape(n, c, h * w)
        mean = out[:, :c] = flat.mean(2)
        out[:, c:2 * c] = np.sqrt(np.maximum(np.einsum("ncp,ncp->nc", flat, flat) / (h * w)
                                             - mean ** 2, 0.0))
        if self._luma is not None:
            weights, offset = self._luma
            out[:, 2 * c] = mean @ weights + offset
        at = len(self.names) - len(LAYOUT)
        grey = x[:, 0] if c == 1 else x.mean(1)
        gx, gy = grey[:, :, 1:] - grey[:, :, :-1], grey[:, 1:] - grey[:, :-1]
        horizontal = np.einsum("nij,nij->n", gx, gx) / max(h * (w - 1), 1)
        vertical = np.einsum("nij,nij->n", gy, gy) / max((h - 1) * w, 1)
        low = grey.reshape(n, h * w).min(1)
        out[:, at] = flat.reshape(n, -1).max(1)
        out[:, at + 1] = np.log((horizontal + EPS) / (vertical + EPS))
        # the mass (grey minus its darkest value) projected on each axis, without building it
        along_y = grey.sum(2) - (low * w)[:, None]
        along_x = grey.sum(1) - (low * h)[:, None]
        total = np.maximum(along_y.sum(1), EPS)[:, None]
        y, x_ = along_y @ self._y / total, along_x @ self._x / total
        out[:, at + 2], out[:, at + 3] = x_[:, 0], y[:, 0]
        out[:, at + 4] = np.log((y[:, 1] - y[:, 0] ** 2 + EPS) / (x_[:, 1] - x_[:, 0] ** 2 + EPS))
        out[:, at + 5], out[:, at + 6] = y[:, 2], x_[:, 2]
        return out
