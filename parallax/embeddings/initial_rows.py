"""A new id's first row, drawn from the id itself: the same value on one device and on any
worker, whatever server holds it, whenever it first appears and beside whatever other ids.

Each element is a counter-based draw: a 64-bit hash of (table, id, column) mixed by
SplitMix64's finalizer, its top 24 bits a uniform in [0, 1) (exactly representable in float32),
turned into the initializer's distribution by an affine map or, for a normal, by interpolating
its inverse CDF between QUANTILES + 1 points (a truncated normal needs no rejection). Only
gathers, additions and multiplications make a value: TensorFlow's vectorized transcendental
functions round an element by where it falls in the tensor, which would make a row depend on
the ids beside it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import functools
import math
import statistics
from typing import Any

import numpy as np
import tensorflow as tf

from parallax.errors import ParallaxError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1, _MIX_2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_TRUNCATE_AT = 2.0  # TensorFlow's truncated normal: redrawn beyond two standard deviations
QUANTILES = 4096
# Initializer classes by name (tf.compat.v1, TF2 and Keras spell them alike) -> our kind and
# the config keys of its two parameters.
_BY_CLASS = {"Zeros": ("zeros", None, None), "Ones": ("constant", None, None),
             "Constant": ("constant", "value", None),
             "RandomUniform": ("uniform", "minval", "maxval"),
             "RandomNormal": ("normal", "mean", "stddev"),
             "TruncatedNormal": ("truncated_normal", "mean", "stddev")}


def mix(bits: tf.Tensor) -> tf.Tensor:
    """SplitMix64's finalizer of uint64 `bits`: each output bit depends on every input bit."""
    bits = tf.bitwise.bitwise_xor(bits, tf.bitwise.right_shift(bits, np.uint64(30))) * _MIX_1
    bits = tf.bitwise.bitwise_xor(bits, tf.bitwise.right_shift(bits, np.uint64(27))) * _MIX_2
    return tf.bitwise.bitwise_xor(bits, tf.bitwise.right_shift(bits, np.uint64(31)))


def key_bits(keys: tf.Tensor) -> tf.Tensor:
    """A uint64 for each key of an int64 or string tensor, the same in every process."""
    if keys.dtype == tf.string:
        keys = tf.strings.to_hash_bucket_fast(keys, np.iinfo(np.int64).max)
    return tf.bitcast(keys, tf.uint64)


def seed_of(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@dataclasses.dataclass(frozen=True)
class RowInitializer:
    """What a table's new row is drawn from: `kind` ('zeros', 'constant', 'uniform', 'normal'
    or 'truncated_normal') with parameters `a`
    (value, minval or mean) and `b` (maxval or stddev), and the table's seed."""
    kind: str
    a: float
    b: float
    seed: int

    def rows(self, keys: tf.Tensor, dim: int, dtype: tf.DType) -> tf.Tensor:
        """The first rows of `keys` (a vector): [len(keys), dim]."""
        count = tf.shape(keys, out_type=tf.int64)[0]
        if self.kind in ("zeros", "constant"):
            return tf.fill(tf.stack([count, dim]), tf.constant(self.a, dtype))
        row = mix(tf.bitwise.bitwise_xor(key_bits(keys), np.uint64(self.seed)))[:, None]
        column = tf.constant(np.arange(1, dim + 1, dtype=np.uint64) * _GOLDEN)[None, :]
        top = tf.bitwise.right_shift(mix(row + column), np.uint64(40))  # 24 bits
        if self.kind == "uniform":
            unit = tf.cast(top, tf.float32) / 2.0 ** 24
            return tf.cast(self.a + (self.b - self.a) * unit, dtype)
        unit = (tf.cast(top, tf.float32) + 0.5) / 2.0 ** 24
        at = tf.clip_by_value(unit * float(QUANTILES + 1) - 0.5, 0.0, float(QUANTILES))
        below = tf.minimum(tf.floor(at), QUANTILES - 1.0)
        points = tf.constant(_quantiles(self.kind == "truncated_normal"), tf.float32)
        low = tf.gather(points, tf.cast(below, tf.int32))
        high = tf.gather(points, tf.cast(below, tf.int32) + 1)
        standard = low + (high - low) * (at - below)
        return tf.cast(self.a + self.b * standard, dtype)


@functools.lru_cache(maxsize=2)
def _quantiles(truncated: bool) -> np.ndarray:
    """The standard normal's (or its truncation's) inverse CDF at the midpoints of
    QUANTILES + 1 equal parts of (0, 1)."""
    low = 0.5 * math.erfc(_TRUNCATE_AT / math.sqrt(2.0)) if truncated else 0.0
    normal = statistics.NormalDist()
    return np.array([normal.inv_cdf(low + (1.0 - 2.0 * low) * (i + 0.5) / (QUANTILES + 1))
                     for i in range(QUANTILES + 1)], np.float32)


def from_user(initializer: Any, table: str, dim: int) -> RowInitializer:
    """The RowInitializer of a table's `initializer` argument: None (a truncated normal of
    standard deviation 1/sqrt(dim), as tf.feature_column's embeddings), a number (every
    element), or a tf.compat.v1, TF2 or Keras initializer of a kind in _BY_CLASS."""
    if initializer is None:
        return RowInitializer("truncated_normal", 0.0, 1.0 / math.sqrt(dim), seed_of(table))
    if isinstance(initializer, (int, float)):
        return RowInitializer("constant", float(initializer), 0.0, seed_of(table))
    known = _BY_CLASS.get(type(initializer).__name__)
    config = initializer.get_config() if hasattr(initializer, "get_config") else None
    if known is None or config is None:
        raise ParallaxError(
            f"dynamic embedding '{table}': initializer {initializer!r} is not one a row can be "
            "drawn from its id with; use None, a number, or an initializer Zeros, Ones, "
            "Constant, RandomUniform, RandomNormal or TruncatedNormal (tf.compat.v1, TF2 or "
            "Keras)")
    kind, first, second = known
    a = 1.0 if type(initializer).__name__ == "Ones" else float(config.get(first, 0.0) or 0.0)
    if kind == "constant" and np.ndim(config.get(first, 0.0)) != 0:
        raise ParallaxError(f"dynamic embedding '{table}': a Constant initializer of a "
                            "table takes one number (every element of a new row)")
    b = float(config[second]) if second else 0.0
    return RowInitializer(kind, a, b, seed_of(f"{table}/{config.get('seed') or 0}"))
