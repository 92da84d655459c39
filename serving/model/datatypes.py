"""The Open Inference Protocol's numeric datatypes as numpy types: what a tensor of each is in
memory and in the binary form (little-endian), for the protocol, the release files and the
input kinds alike."""

from __future__ import annotations

from typing import Any

import numpy as np

NUMERIC = {"BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
           "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2",
           "FP32": "<f4", "FP64": "<f8"}


def native(datatype: str) -> np.dtype[Any]:
    """The datatype's numpy type in this machine's byte order."""
    return np.dtype(NUMERIC[datatype]).newbyteorder("=")
