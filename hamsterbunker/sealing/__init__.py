"""AES-256-GCM sealing of agent state and of every record that steers a node (DESIGN.md
invariant 5): the ``Sealer`` (``sealer``), the sealed formats (``formats``) and the
records of work (``work``). ``docs/design.md`` ("Sealed records") tells the formats."""

from .cluster_keys import SCRYPT_MAX_MEMORY, SCRYPT_MAX_WORK, check_scrypt_parameters
from .formats import SealedHeader, gcm_pieces, read_header, sealed_key_id
from .keyring import MIN_SECRET_LENGTH, check_secret
from .sealer import Sealer, new_cluster_record
from .work import EffectAt, OpenedEffect, OpenedSubmission

__all__ = [
    "MIN_SECRET_LENGTH",
    "SCRYPT_MAX_MEMORY",
    "SCRYPT_MAX_WORK",
    "EffectAt",
    "OpenedEffect",
    "OpenedSubmission",
    "SealedHeader",
    "Sealer",
    "check_scrypt_parameters",
    "check_secret",
    "gcm_pieces",
    "new_cluster_record",
    "read_header",
    "sealed_key_id",
]
