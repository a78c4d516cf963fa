"""The etcd store, one module per part; ``store`` holds ``EtcdStore`` and the key layout.

Imported only when an etcd:// URL is opened: it needs etcd3gw.
"""

from ..backends.etcd_connection import EtcdTarget, parse_etcd_url
from .store import GUARANTEES, EtcdStore

__all__ = ["GUARANTEES", "EtcdStore", "EtcdTarget", "parse_etcd_url"]
