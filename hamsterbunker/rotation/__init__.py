"""Rotating the cluster's secret online (``steps``): the steps, what they re-seal
(``reseal``) and the live nodes they wait for (``nodes``)."""

from .reseal import Resealed
from .steps import Rotation

__all__ = ["Resealed", "Rotation"]
