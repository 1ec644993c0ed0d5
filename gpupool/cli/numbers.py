"""Argument types for numbers a verb needs finite and in range: argparse reports anything
else as a usage error (exit 2) naming the option, before the verb touches the lab."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number: {text}")
    return value


def positive_float(text: str) -> float:
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0: {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number from 0: {text}")
    return value


def percentile(text: str) -> float:
    value = _finite(text)
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 100: {text}")
    return value
