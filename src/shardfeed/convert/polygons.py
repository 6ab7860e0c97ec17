"""Polygons to instance masks: rasterised at pixel centres, stored as PNG.

A pixel ``(i, j)`` belongs to a polygon when its centre ``(i + 0.5, j + 0.5)`` is inside it
(even-odd rule, so a self-crossing outline still gives a mask; a centre exactly on a left
or top edge is in, on a right or bottom edge out). With this rule the pixel count of a mask
tracks the polygon's area: the rectangle from (10, 20) to (50, 60) covers exactly 40 x 40
pixels, and two polygons sharing an edge never share a pixel. Pillow's ``ImageDraw.polygon``
instead fills the outline too (41 x 41 for that rectangle).
"""

from __future__ import annotations

import io

import numpy as np


def polygon_area(points: np.ndarray) -> float:
    """Area (shoelace formula) of the polygon with vertices ``points`` (n x 2): the signed
    areas of a self-crossing outline's loops cancel (a symmetric bow tie gives 0), so this
    is not the test of an empty polygon (:func:`collinear` is)."""
    x, y = points[:, 0], points[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def collinear(points: np.ndarray) -> bool:
    """Whether every vertex of ``points`` (n x 2) lies on one line (or on one point): the
    polygon encloses nothing, whatever the order of its vertices. A self-crossing outline
    (a bow tie) is not: its loops enclose pixels under the even-odd rule."""
    d = np.asarray(points, np.float64) - np.asarray(points[0], np.float64)
    far = d[int(np.argmax(np.abs(d).sum(axis=1)))] if len(d) else np.zeros(2)  # the line's direction, if any
    scale = float(np.abs(far).max())
    if scale == 0.0:
        return True  # every vertex on one point
    cross = d[:, 0] * far[1] - d[:, 1] * far[0]  # each vertex's distance from that line, times its length
    return float(np.abs(cross).max()) <= 1e-12 * scale * float(np.abs(d).max())


def rasterize(points: np.ndarray, width: int, height: int) -> np.ndarray:
    """A ``height x width`` uint8 mask, 1 where a pixel centre is inside the polygon."""
    pts = np.asarray(points, np.float64)
    mask = np.zeros((height, width), np.uint8)
    y_lo = max(0, int(np.floor(pts[:, 1].min() - 0.5)))
    y_hi = min(height, int(np.ceil(pts[:, 1].max() + 0.5)))
    if y_hi <= y_lo or width < 1:
        return mask
    x0, y0 = pts[:, 0], pts[:, 1]
    x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
    yc = np.arange(y_lo, y_hi, dtype=np.float64)[:, None] + 0.5  # rows x 1
    crosses = (y0[None, :] <= yc) != (y1[None, :] <= yc)  # half-open: each crossing counted once
    with np.errstate(divide="ignore", invalid="ignore"):
        xs = x0[None, :] + (yc - y0[None, :]) * ((x1 - x0) / (y1 - y0))[None, :]
    xs = np.where(crosses, xs, np.inf)
    xs.sort(axis=1)
    xa, xb = xs[:, 0::2], xs[:, 1::2]
    n = min(xa.shape[1], xb.shape[1])
    xa, xb = xa[:, :n], xb[:, :n]
    ok = np.isfinite(xa) & np.isfinite(xb)
    rows = np.nonzero(ok)[0]
    start = np.clip(np.ceil(xa[ok] - 0.5), 0, width).astype(np.int64)
    end = np.clip(np.ceil(xb[ok] - 0.5), 0, width).astype(np.int64)
    diff = np.zeros((y_hi - y_lo, width + 1), np.int32)
    np.add.at(diff, (rows, start), 1)
    np.add.at(diff, (rows, end), -1)
    mask[y_lo:y_hi] = (np.cumsum(diff, axis=1)[:, :width] > 0).astype(np.uint8)
    return mask


def encode_mask(mask: np.ndarray) -> bytes:
    """A 0/1 mask as a one-channel 8-bit PNG (values stay 0 and 1)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(mask, np.uint8), "L").save(out, "PNG")
    return out.getvalue()
